"""Frames from packing to ack: each payload numbered 1, 2, 3... in one session and kept
until the agent acks or nacks it.

Its bytes are bounded; what does not fit is dropped and counted by reason in `lost` (the
sender turns those counts into `loss` events). Packing events into payloads is
emitters/packing.py's job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from emitters import wire
from emitters.columns_items import deferred_columns, emit_columns
from emitters.columns_read import read_rows
from emitters.events import BUILT_LENGTH, Context, build_events
from emitters.ids import new_session_id
from emitters.packing import ColumnsPacker, FramePacker
from emitters.values import values_left_to_agent


class PendingFrame(NamedTuple):
    """One frame the agent has not answered yet, as sent, and its events."""

    frame: bytes
    events: int

    @property
    def is_columns(self) -> bool:
        return wire.frame_type(self.frame) == wire.COLUMNS

    def events_at(self, indexes: set[int]) -> dict[int, Any]:
        """Its events at these indexes as the agent counts them (a batch's non-blank
        lines, a COLUMNS frame's rows), for naming the events the agent refused; one read
        of the frame, and an index it cannot read is left out."""
        payload = wire.payload_of(self.frame)
        if self.is_columns:
            try:
                rows: list[Any] = read_rows(payload, self.events)
            except ValueError:
                return {}
            return {i: rows[i] for i in indexes if i < len(rows)}
        lines = [line for line in payload.split(b"\n") if line.strip()]
        found = {}
        for i in indexes:
            try:
                found[i] = orjson.loads(lines[i])
            except (IndexError, ValueError):
                continue
        return found


class Outbox:
    def __init__(self, max_frame_bytes: int, max_buffer_bytes: int) -> None:
        self.session = new_session_id()
        self.frames: dict[int, PendingFrame] = {}  # by seq, in seq order
        self.bytes = 0
        self.max_buffer_bytes = max_buffer_bytes
        self.lost: Counter[str] = Counter()  # events dropped, by reason
        self._packer = FramePacker(max_frame_bytes - wire.BATCH_HEADER, self.lost)
        self._columns = ColumnsPacker(max_frame_bytes - wire.BATCH_HEADER, self.lost)
        self._next_seq = 1
        self.resize(max_frame_bytes, max_buffer_bytes)

    def resize(self, max_frame_bytes: int, max_buffer_bytes: int) -> None:
        # A frame larger than the whole buffer could never be kept.
        self._packer.max_bytes = min(max_frame_bytes, max_buffer_bytes) - wire.BATCH_HEADER
        self._columns.max_bytes = self._packer.max_bytes
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

    def add_events(self, events: Sequence[dict[str, Any]]) -> Iterator[int]:
        """Pack events; yield the seq of each frame that filled up."""
        for payload, count in self._packer.add(events):
            seq = self.add_payload(payload, count)
            if seq is not None:
                yield seq

    def add_rows(self, rows: list[dict[str, Any]], base: Mapping[str, Any],
                 trusted: bool) -> Iterator[int]:
        """Pack rows (events without `base`) as COLUMNS; yield the seq of each frame made."""
        for made in self._columns.add(rows, base, trusted):
            yield from self._keep(made)

    def add_columns(self, columns: dict[str, list[Any]], n: int,
                    base: Mapping[str, Any]) -> Iterator[int]:
        """The same for n rows already in columns."""
        for made in self._columns.add_columns(columns, n, base):
            yield from self._keep(made)

    def add_items(self, items: list[tuple[Any, ...]], context: Context) -> list[int]:
        """Queued emit()/op()/built items as COLUMNS: plain emit() runs and training
        steps straight into columns, the rest through event rows; the seqs of the frames
        made. Raises what build_events raises."""
        try:
            columns = emit_columns(items, context) or deferred_columns(items, context)
        except Exception:  # a bug there costs the fast path, not the events
            columns = None
        if columns is not None:
            return list(self.add_columns(columns, len(items), context.base))
        left_before = values_left_to_agent()
        rows = build_events(items, Context({}, context.attrs), self.lost)
        # Built rows, and rows holding a value left for the agent to refuse, are encoded
        # with their types checked: such a row goes as NDJSON, where the agent says why.
        trusted = (BUILT_LENGTH not in map(len, items)
                   and values_left_to_agent() == left_before)
        return list(self.add_rows(rows, context.base, trusted))

    def close_frame(self) -> Iterator[int]:
        """Make frames of what is packed so far; the seq of each one kept."""
        for made in self._columns.close():
            yield from self._keep(made)
        closed = self._packer.close()
        if closed is not None and (seq := self.add_payload(*closed)) is not None:
            yield seq

    def _keep(self, made: tuple[bytes, int] | list[dict[str, Any]]) -> Iterator[int]:
        if isinstance(made, tuple):
            seq = self.add_payload(*made, frame_type=wire.COLUMNS)
            if seq is not None:
                yield seq
            return
        yield from self.add_events(made)  # rows the columns cannot carry go as NDJSON
        closed = self._packer.close()
        if closed is not None and (seq := self.add_payload(*closed)) is not None:
            yield seq

    def frames_as_ndjson(self) -> tuple[list[int], list[int]]:
        """Every unacked COLUMNS frame made again as NDJSON, for an agent that refuses
        COLUMNS (so it stored none of them): the seqs removed and the seqs made."""
        removed = [seq for seq, pending in self.frames.items() if pending.is_columns]
        made: list[int] = []
        for seq in removed:
            frame, count = self.frames.pop(seq)
            self.bytes -= len(frame)
            events = read_rows(wire.payload_of(frame), count)
            made += self.add_events(events)
            closed = self._packer.close()
            if closed is not None:
                made.append(self._store(*closed, wire.BATCH))
        return removed, made

    def add_payload(self, payload: bytes, count: int, force: bool = False,
                    frame_type: int = wire.BATCH) -> int | None:
        if not force and self.bytes + len(payload) + wire.FRAME_OVERHEAD > self.max_buffer_bytes:
            self.lost["buffer_full"] += count
            return None
        return self._store(payload, count, frame_type)

    def _store(self, payload: bytes, count: int, frame_type: int) -> int:
        encode = wire.encode_columns if frame_type == wire.COLUMNS else wire.encode_batch
        frame = encode(self.session, self._next_seq, count, payload)
        seq = self._next_seq
        self._next_seq += 1
        self.frames[seq] = PendingFrame(frame, count)
        self.bytes += len(frame)
        return seq

    def settle(self, seq: int) -> PendingFrame | None:
        """Forget an acked or nacked frame; None if it was settled already."""
        entry = self.frames.pop(seq, None)
        if entry is not None:
            self.bytes -= len(entry.frame)
        return entry
