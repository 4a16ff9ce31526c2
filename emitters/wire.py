"""The Unix-socket wire protocol between producers and the agent.

Every frame is length-prefixed (all integers big-endian):

    u32  length of what follows
    u8   protocol version (1)
    u8   frame type
    ...  type-specific body

    BATCH (producer -> agent):  16s session, u64 seq, u32 event count, NDJSON events
    COLUMNS (producer -> agent): 16s session, u64 seq, u32 event count, the events'
                                columns in Arrow's layout (emitters/columns.py, and
                                docs/wire-protocol.md to the byte)
    ACK   (agent -> producer):  16s session, u64 seq, u32 accepted, u32 rejected,
                                utf-8 note (first rejection reason, may be empty)
    NACK  (agent -> producer):  16s session, u64 seq, utf-8 reason

A producer numbers its frames 1, 2, 3... within its session and keeps each one until
it is acked; after a reconnect it resends the unacked ones in order. The agent acks a
(session, seq) it already holds without storing it again, so a frame reaches the spool
exactly once. A NACK means the frame can never be accepted (the producer drops it and
counts it); the agent closes the connection after a NACK whose frame it could not parse.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

VERSION: Final = 1
BATCH: Final = 1
ACK: Final = 2
NACK: Final = 3
COLUMNS: Final = 4
# What an agent that predates COLUMNS answers one with (a NACK with no session): the
# emitter reads it as "send NDJSON here", not as a bad frame.
UNKNOWN_TYPE_REASON: Final = "unknown frame type {}"

DEFAULT_MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
SESSION_BYTES: Final = 16
NO_SESSION: Final = bytes(SESSION_BYTES)

_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">BB")
_BATCH = struct.Struct(">BB16sQI")
_ACK = struct.Struct(">BB16sQII")
_NACK = struct.Struct(">BB16sQ")


BATCH_HEADER: Final = _BATCH.size  # version, type, session, seq, count: before the payload
FRAME_OVERHEAD: Final = _LENGTH.size + BATCH_HEADER  # an encoded frame's bytes besides its payload


def frame_type(frame: bytes) -> int:
    """BATCH or COLUMNS: the type byte of an encoded batch frame (after its length)."""
    return frame[_LENGTH.size + 1]


def payload_of(frame: bytes) -> bytes:
    """The payload of an encoded batch frame."""
    return frame[_LENGTH.size + _BATCH.size:]


class FrameError(ValueError):
    """A frame that cannot be parsed. The message is the reason sent back in a NACK."""


@dataclass(frozen=True, slots=True)
class Batch:
    session: bytes
    seq: int
    count: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Columns:
    session: bytes
    seq: int
    count: int
    payload: bytes  # the column table and buffers, after the 30-byte header


@dataclass(frozen=True, slots=True)
class Ack:
    session: bytes
    seq: int
    accepted: int
    rejected: int
    note: str


@dataclass(frozen=True, slots=True)
class Nack:
    session: bytes
    seq: int
    reason: str


Frame = Batch | Columns | Ack | Nack


def encode_batch(session: bytes, seq: int, count: int, payload: bytes) -> bytes:
    body = _BATCH.pack(VERSION, BATCH, session, seq, count)
    return _LENGTH.pack(len(body) + len(payload)) + body + payload


def encode_columns(session: bytes, seq: int, count: int, payload: bytes) -> bytes:
    body = _BATCH.pack(VERSION, COLUMNS, session, seq, count)
    return _LENGTH.pack(len(body) + len(payload)) + body + payload


def refuses_columns(nack: Nack) -> bool:
    """Whether a NACK is an agent's answer to a frame type it does not know (COLUMNS)."""
    return nack.session == NO_SESSION and nack.reason == UNKNOWN_TYPE_REASON.format(COLUMNS)


def encode_ack(session: bytes, seq: int, accepted: int, rejected: int, note: str = "") -> bytes:
    text = note.encode("utf-8", "replace")[:4096]
    body = _ACK.pack(VERSION, ACK, session, seq, accepted, rejected) + text
    return _LENGTH.pack(len(body)) + body


def encode_nack(session: bytes, seq: int, reason: str) -> bytes:
    text = reason.encode("utf-8", "replace")[:4096]
    body = _NACK.pack(VERSION, NACK, session, seq) + text
    return _LENGTH.pack(len(body)) + body


def decode_body(body: bytes) -> Frame:
    """Parse one frame body (the bytes after the length prefix)."""
    if len(body) < _HEAD.size:
        raise FrameError(f"frame of {len(body)} bytes is shorter than its header")
    version, frame_type = _HEAD.unpack_from(body)
    if version != VERSION:
        raise FrameError(f"unsupported protocol version {version} (this agent speaks {VERSION})")
    if frame_type == BATCH:
        if len(body) < _BATCH.size:
            raise FrameError("batch frame shorter than its header")
        _, _, session, seq, count = _BATCH.unpack_from(body)
        return Batch(session, seq, count, body[_BATCH.size :])
    if frame_type == COLUMNS:
        if len(body) < _BATCH.size:
            raise FrameError("columns frame shorter than its header")
        _, _, session, seq, count = _BATCH.unpack_from(body)
        return Columns(session, seq, count, body[_BATCH.size :])
    if frame_type == ACK:
        if len(body) < _ACK.size:
            raise FrameError("ack frame shorter than its header")
        _, _, session, seq, accepted, rejected = _ACK.unpack_from(body)
        return Ack(session, seq, accepted, rejected, _text(body[_ACK.size :]))
    if frame_type == NACK:
        if len(body) < _NACK.size:
            raise FrameError("nack frame shorter than its header")
        _, _, session, seq = _NACK.unpack_from(body)
        return Nack(session, seq, _text(body[_NACK.size :]))
    raise FrameError(UNKNOWN_TYPE_REASON.format(frame_type))


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class FrameBuffer:
    """Incremental decoder: feed bytes as they arrive, take whole frames out.

    Raises FrameError for an oversized length or a malformed frame; the buffer is then
    unusable and the connection must be closed.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def next_length(self) -> int | None:
        """The body length of the next frame once its prefix has arrived."""
        if len(self._buf) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._buf)
        if length > self._max:
            raise FrameError(f"frame of {length} bytes exceeds the limit of {self._max}")
        return int(length)

    def pop(self) -> Frame | None:
        length = self.next_length()
        if length is None or len(self._buf) < _LENGTH.size + length:
            return None
        body = bytes(self._buf[_LENGTH.size : _LENGTH.size + length])
        del self._buf[: _LENGTH.size + length]
        return decode_body(body)

    def frames(self) -> list[Frame]:
        out: list[Frame] = []
        while (frame := self.pop()) is not None:
            out.append(frame)
        return out
