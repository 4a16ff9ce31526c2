"""Frames from encoding to ack: NDJSON payloads packed to a size, kept until acked.

The outbox numbers frames 1, 2, 3... in one session and keeps each until the agent acks
or nacks it; its bytes are bounded, and what does not fit is dropped and counted by
reason in `lost` (the sender turns those counts into `loss` events).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from emitters import wire
from emitters.events import scrub
from emitters.ids import new_session_id

BATCH_HEADER = 30  # version, type, session, seq, count: body bytes before the payload


class FramePacker:
    """Packs encoded events into NDJSON payloads of at most `max_bytes`.

    orjson keeps several KB alive per `dumps()` result, so per-event encodings live only
    for one chunk of CHUNK events before they are joined into the payload.
    """

    CHUNK = 256

    def __init__(self, max_bytes: int, dropped: Counter[str]) -> None:
        self.max_bytes = max_bytes
        self._dropped = dropped
        self._buf = bytearray()
        self._count = 0

    def add(self, events: Sequence[dict[str, Any]]) -> list[tuple[bytes, int]]:
        """Take events; return the payloads (with event counts) that filled up."""
        full: list[tuple[bytes, int]] = []
        for start in range(0, len(events), self.CHUNK):
            encoded = self._encode(events[start : start + self.CHUNK])
            size = sum(map(len, encoded)) + len(encoded)
            if encoded and len(self._buf) + size <= self.max_bytes:
                self._buf += b"\n".join(encoded)
                self._buf += b"\n"
                self._count += len(encoded)
                continue
            for one in encoded:
                self._add_one(one, full)
        return full

    def close(self) -> tuple[bytes, int] | None:
        """The payload being filled, if it holds any event."""
        if not self._count:
            return None
        payload = (bytes(self._buf), self._count)
        self._buf = bytearray()
        self._count = 0
        return payload

    def _add_one(self, one: bytes, full: list[tuple[bytes, int]]) -> None:
        if len(one) + 1 > self.max_bytes:
            self._dropped["too_large"] += 1
            return
        if len(self._buf) + len(one) + 1 > self.max_bytes:
            closed = self.close()
            if closed is not None:
                full.append(closed)
        self._buf += one
        self._buf += b"\n"
        self._count += 1

    def _encode(self, chunk: Sequence[dict[str, Any]]) -> list[bytes]:
        try:
            return [orjson.dumps(event) for event in chunk]
        except Exception:
            pass  # find the one event that fails, below
        out: list[bytes] = []
        for event in chunk:
            try:
                out.append(orjson.dumps(event))
                continue
            except Exception:
                pass
            try:
                out.append(orjson.dumps(scrub(event)))
            except Exception:
                self._dropped["unencodable"] += 1
        return out


class Outbox:
    def __init__(self, max_frame_bytes: int, max_buffer_bytes: int) -> None:
        self.session = new_session_id()
        self.frames: dict[int, tuple[bytes, int]] = {}  # seq -> (frame, events), in seq order
        self.bytes = 0
        self.max_buffer_bytes = max_buffer_bytes
        self.lost: Counter[str] = Counter()  # events dropped, by reason
        self._packer = FramePacker(max_frame_bytes - BATCH_HEADER, self.lost)
        self._next_seq = 1
        self.resize(max_frame_bytes, max_buffer_bytes)

    def resize(self, max_frame_bytes: int, max_buffer_bytes: int) -> None:
        # A frame larger than the whole buffer could never be kept.
        self._packer.max_bytes = min(max_frame_bytes, max_buffer_bytes) - BATCH_HEADER
        self.max_buffer_bytes = max_buffer_bytes

    @property
    def full(self) -> bool:
        return self.bytes >= self.max_buffer_bytes

    @property
    def last_seq(self) -> int:
        """The seq of the newest frame made so far (0 before the first)."""
        return self._next_seq - 1

    def oldest(self) -> int | None:
        return next(iter(self.frames), None)

    def unacked_events(self) -> int:
        return sum(count for _, count in list(self.frames.values()))

    def add_events(self, events: Sequence[dict[str, Any]]) -> Iterator[int]:
        """Pack events; yield the seq of each frame that filled up."""
        for payload, count in self._packer.add(events):
            seq = self.add_payload(payload, count)
            if seq is not None:
                yield seq

    def close_frame(self) -> int | None:
        """Make a frame of what is packed so far; its seq, if it was kept."""
        closed = self._packer.close()
        return None if closed is None else self.add_payload(*closed)

    def add_payload(self, payload: bytes, count: int, force: bool = False) -> int | None:
        frame = wire.encode_batch(self.session, self._next_seq, count, payload)
        if not force and self.bytes + len(frame) > self.max_buffer_bytes:
            self.lost["buffer_full"] += count
            return None
        seq = self._next_seq
        self._next_seq += 1
        self.frames[seq] = (frame, count)
        self.bytes += len(frame)
        return seq

    def settle(self, seq: int) -> tuple[bytes, int] | None:
        """Forget an acked or nacked frame; None if it was settled already."""
        entry = self.frames.pop(seq, None)
        if entry is not None:
            self.bytes -= len(entry[0])
        return entry
