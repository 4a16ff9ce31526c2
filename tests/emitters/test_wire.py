"""Properties of emitters.wire: garbage only ever raises FrameError; frames round-trip."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emitters import wire

sessions = st.binary(min_size=16, max_size=16)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
notes = st.text(max_size=1000)  # at most 4000 UTF-8 bytes: below the 4096-byte note limit

batches = st.builds(wire.Batch, sessions, u64, u32, st.binary(max_size=2000))
column_frames = st.builds(wire.Columns, sessions, u64, u32, st.binary(max_size=2000))
acks = st.builds(wire.Ack, sessions, u64, u32, u32, notes)
nacks = st.builds(wire.Nack, sessions, u64, notes)


def encode(frame: wire.Frame) -> bytes:
    if isinstance(frame, wire.Batch):
        return wire.encode_batch(frame.session, frame.seq, frame.count, frame.payload)
    if isinstance(frame, wire.Columns):
        return wire.encode_columns(frame.session, frame.seq, frame.count, frame.payload)
    if isinstance(frame, wire.Ack):
        return wire.encode_ack(frame.session, frame.seq, frame.accepted, frame.rejected,
                               frame.note)
    return wire.encode_nack(frame.session, frame.seq, frame.reason)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(st.binary(max_size=4096))
@settings(max_examples=500)
def test_decode_body_raises_nothing_but_frame_error(body: bytes) -> None:
    try:
        frame = wire.decode_body(body)
    except wire.FrameError:
        return
    assert isinstance(frame, (wire.Batch, wire.Columns, wire.Ack, wire.Nack))


@given(st.binary(max_size=4096), st.lists(st.integers(min_value=0, max_value=4096), max_size=8),
       st.integers(min_value=0, max_value=5000))
@settings(max_examples=500)
def test_frame_buffer_raises_nothing_but_frame_error(data: bytes, cuts: list[int],
                                                      limit: int) -> None:
    buffer = wire.FrameBuffer(max_frame_bytes=limit)
    try:
        for piece in split(data, cuts):
            buffer.feed(piece)
            for frame in buffer.frames():
                assert isinstance(frame, (wire.Batch, wire.Columns, wire.Ack, wire.Nack))
    except wire.FrameError:
        return
    assert buffer.pending_bytes <= len(data)


@given(st.binary(max_size=512).map(lambda junk: struct.pack(">IBB", len(junk) + 2, 1, 1) + junk))
def test_valid_lengths_with_garbage_bodies(data: bytes) -> None:
    buffer = wire.FrameBuffer()
    buffer.feed(data)
    try:
        frames = buffer.frames()
    except wire.FrameError:
        return
    assert len(frames) == 1 and isinstance(frames[0], wire.Batch)


@given(st.lists(st.one_of(batches, column_frames, acks, nacks), max_size=6),
       st.lists(st.integers(min_value=0, max_value=20_000), max_size=10))
@settings(max_examples=300)
def test_frames_round_trip_through_any_split(frames: list[wire.Frame], cuts: list[int]) -> None:
    stream = b"".join(encode(f) for f in frames)
    buffer = wire.FrameBuffer()
    decoded: list[wire.Frame] = []
    for piece in split(stream, cuts):
        buffer.feed(piece)
        decoded.extend(buffer.frames())
    assert decoded == frames
    assert buffer.pending_bytes == 0


@given(st.one_of(batches, column_frames, acks, nacks))
def test_decode_body_inverts_encode(frame: wire.Frame) -> None:
    assert wire.decode_body(encode(frame)[4:]) == frame


@given(st.text(min_size=1, max_size=40).map(lambda s: s * (4100 // len(s) + 1)))
def test_long_notes_are_cut_to_4096_bytes(note: str) -> None:
    ack = wire.decode_body(wire.encode_ack(bytes(16), 1, 0, 1, note)[4:])
    nack = wire.decode_body(wire.encode_nack(bytes(16), 1, note)[4:])
    assert isinstance(ack, wire.Ack) and isinstance(nack, wire.Nack)
    for text in (ack.note, nack.reason):
        assert len(text.encode("utf-8")) <= 4096 + 3  # a cut character decodes as U+FFFD
        assert note.startswith(text.rstrip("\ufffd"))


def test_an_oversized_length_is_refused_before_the_body_arrives() -> None:
    buffer = wire.FrameBuffer(max_frame_bytes=1024)
    buffer.feed(struct.pack(">I", 1025))
    with pytest.raises(wire.FrameError, match="exceeds the limit"):
        buffer.pop()


def test_an_unknown_version_or_type_is_named_in_the_error() -> None:
    with pytest.raises(wire.FrameError, match="version 9"):
        wire.decode_body(bytes([9, 1]) + bytes(28))
    with pytest.raises(wire.FrameError, match="unknown frame type 7"):
        wire.decode_body(bytes([1, 7]))


def test_a_partial_frame_waits_for_the_rest() -> None:
    frame = wire.encode_batch(bytes(range(16)), 5, 2, b'{"kind":"a"}\n{"kind":"b"}\n')
    buffer = wire.FrameBuffer()
    buffer.feed(frame[:-1])
    assert buffer.pop() is None and buffer.pending_bytes == len(frame) - 1
    buffer.feed(frame[-1:])
    assert buffer.pop() == wire.Batch(bytes(range(16)), 5, 2, b'{"kind":"a"}\n{"kind":"b"}\n')


def test_an_agent_before_columns_answers_in_words_the_emitter_reads() -> None:
    """What an agent that predates COLUMNS NACKs one with (the text of its decode_body)."""
    with pytest.raises(wire.FrameError) as refused:
        wire.decode_body(struct.pack(">BB", wire.VERSION, 9))
    assert str(refused.value) == "unknown frame type 9"
    answer = wire.decode_body(wire.encode_nack(wire.NO_SESSION, 0, "unknown frame type 4")[4:])
    assert isinstance(answer, wire.Nack) and wire.refuses_columns(answer)
    other = wire.decode_body(wire.encode_nack(wire.NO_SESSION, 0, "stalled")[4:])
    assert isinstance(other, wire.Nack) and not wire.refuses_columns(other)
