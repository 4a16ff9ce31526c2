"""Batches: encoded rows cut by count, bytes and age, the key that names each, its body.

A row's position is (spool offset, index among the rows of that record the filter
kept). Positions only grow, so a batch is the run of rows from one position up to
(not including) another, and the same positions name the same rows on every resend.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from sinks.http.body import EncodedRows
from sinks.records import SpoolRecord

Position = tuple[int, int]
Int64s = npt.NDArray[np.int64]
BodyFormat = Literal["ndjson", "json"]
Body = bytes | bytearray | memoryview


def idempotency_key(sink: str, spool_id: str, first: Position, last: Position,
                    whole_records: bool) -> str:
    """The batch's Idempotency-Key: a hash of sink name, spool id, first and last offset.

    A batch that starts or ends inside a record (records larger than a batch) also names
    the row positions, so the pieces of one record get different keys.
    """
    if whole_records:
        material = f"{sink}\n{spool_id}\n{first[0]}\n{last[0]}"
    else:
        material = f"{sink}\n{spool_id}\n{first[0]}.{first[1]}\n{last[0]}.{last[1]}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def frame_body(parts: Sequence[bytes | memoryview], body_format: BodyFormat) -> Body:
    """Encoded rows as a request body: NDJSON as they are (rows of one chunk without a
    copy), or one JSON array: the rows' newlines become commas, the last one "]"."""
    if body_format == "ndjson":
        return parts[0] if len(parts) == 1 else b"".join(parts)
    size = sum(len(p) for p in parts)
    if not size:
        return b"[]"
    body = bytearray(size + 1)
    body[0], at = ord("["), 1
    for part in parts:
        body[at : at + len(part)] = part
        at += len(part)
    view = np.frombuffer(body, np.uint8)
    view[view == ord("\n")] = ord(",")  # a raw newline only ever ends a row
    body[-1] = ord("]")
    return body


def gzip_body(body: Body, level: int = 1) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31: gzip container
    return compressor.compress(body) + compressor.flush()


@dataclass(frozen=True, slots=True)
class Taken:
    """Rows cut from the front of the pending rows."""

    parts: list[memoryview]
    first: Position
    last: Position
    events: int
    ends_record: bool  # the last row is its record's last kept row

    @property
    def whole_records(self) -> bool:
        return self.first[1] == 0 and self.ends_record


@dataclass(slots=True)
class _Chunk:
    rows: EncodedRows
    offsets: Int64s
    indexes: Int64s
    head: int = 0  # rows before this are already in a batch


class PendingRows:
    """Encoded rows not yet in a batch, oldest first, with their positions and age."""

    def __init__(self) -> None:
        self._chunks: deque[_Chunk] = deque()
        self._count = 0
        self.size = 0  # bytes
        self.since: float | None = None  # when the oldest pending row arrived

    def __len__(self) -> int:
        return self._count

    def add(self, chunks: list[EncodedRows], row_offsets: Int64s, now: float) -> None:
        """Rows of whole records in offset order; `row_offsets[i]` is row i's record."""
        starts = np.searchsorted(row_offsets, row_offsets, side="left")
        indexes = np.arange(len(row_offsets), dtype=np.int64) - starts
        at = 0
        for rows in chunks:
            self._chunks.append(_Chunk(rows, row_offsets[at : at + len(rows)],
                                       indexes[at : at + len(rows)]))
            at += len(rows)
            self._count += len(rows)
            self.size += len(rows.data)
        if self._count and self.since is None:
            self.since = now

    def position(self) -> Position:
        """Position of the oldest pending row (there must be one)."""
        chunk = self._chunks[0]
        return int(chunk.offsets[chunk.head]), int(chunk.indexes[chunk.head])

    def reaches(self, stop: Position) -> bool:
        """True when every row before `stop` is pending (a planned batch can be cut)."""
        if not self._chunks:
            return False
        chunk = self._chunks[-1]
        last = (int(chunk.offsets[-1]), int(chunk.indexes[-1]))
        return last >= (stop[0], stop[1] - 1)

    def take(self, max_rows: int, max_bytes: int, stop: Position | None = None) -> Taken:
        """Cut up to max_rows rows and max_bytes bytes (at least one row), or up to `stop`."""
        parts: list[memoryview] = []
        first, last, count, size = self.position(), (0, 0), 0, 0
        while self._chunks and count < max_rows:
            chunk = self._chunks[0]
            available = min(len(chunk.rows) - chunk.head, max_rows - count)
            n = self._fitting(chunk, available, max_bytes - size, stop, first_row=not count)
            if n == 0:
                break
            parts.append(chunk.rows.rows(chunk.head, chunk.head + n))
            end = chunk.head + n - 1
            last = (int(chunk.offsets[end]), int(chunk.indexes[end]))
            count, size = count + n, size + len(parts[-1])
            chunk.head += n
            if chunk.head == len(chunk.rows):
                self._chunks.popleft()
            if n < available:
                break
        self._count -= count
        self.size -= size
        if not self._count:
            self.since = None
        ends_record = not self._count or self.position()[0] != last[0]
        return Taken(parts, first, last, count, ends_record)

    @staticmethod
    def _fitting(chunk: _Chunk, available: int, room: int, stop: Position | None,
                 first_row: bool) -> int:
        """How many of the chunk's next `available` rows go into the batch."""
        head = chunk.head
        if stop is not None:
            offsets = chunk.offsets[head : head + available]
            indexes = chunk.indexes[head : head + available]
            before = (offsets < stop[0]) | ((offsets == stop[0]) & (indexes < stop[1]))
            return int(np.count_nonzero(before))
        ends = chunk.rows.ends[head : head + available] - chunk.rows.start(head)
        n = int(np.searchsorted(ends, room, side="right"))
        return max(n, 1) if first_row else n


@dataclass(slots=True)
class Batch:
    """Rows cut for one request, and what they cover."""

    key: str
    first: Position
    stop: Position  # just after its last row
    through: int  # highest offset fully delivered once this and every earlier batch are
    events: int
    body: Body  # uncompressed
    resend: bool  # these rows went out before under this key
    acknowledged: bool  # ...and were answered: nothing to send


class Batcher:
    """Cuts pending rows into batches. It remembers the boundaries of batches the cursor
    has not passed, across `reset()`, so that a resend after a failure cuts exactly the
    same rows under the same key, even for a batch that was cut by age. The cursor moves
    by whole records: when a delivered batch ended inside a record, the loop reads that
    record again after a failure, and the rows of it that batch delivered are dropped,
    not sent again under a new key."""

    def __init__(self, sink: str, spool_id: str, body_format: BodyFormat, max_events: int,
                 max_bytes: int, interval_s: float) -> None:
        self.sink, self.spool_id, self.body_format = sink, spool_id, body_format
        self.max_events, self.max_bytes, self.interval_s = max_events, max_bytes, interval_s
        self._plan: dict[Position, tuple[Position, bool]] = {}  # first -> (stop, answered)
        self._delivered_into: Position | None = None  # rows of its record before it: sent
        self.reset()

    def reset(self) -> None:
        """Forget pending rows (the loop resends from its cursor); keep the boundaries."""
        self.pending = PendingRows()
        self.seen_through: int | None = None  # last offset handed over

    def add(self, chunks: list[EncodedRows], row_offsets: Int64s, first_offset: int,
            last_offset: int, now: float) -> None:
        """Encoded rows of the records first_offset..last_offset (in a worker thread)."""
        if self.seen_through is None:  # starting from the cursor: what lies before is done
            for position in [p for p in self._plan if p[0] < first_offset]:
                del self._plan[position]
            if self._delivered_into is not None and self._delivered_into[0] < first_offset:
                self._delivered_into = None
        self.pending.add(chunks, row_offsets, now)
        self.seen_through = last_offset

    def cut(self, final: bool, now: float) -> list[Batch]:
        """Batches due now: full ones, planned ones (resends), aged or final remainders."""
        cut = []
        while len(self.pending):
            first = self.pending.position()
            delivered = self._delivered_into
            if delivered is not None and first[0] == delivered[0] and first < delivered:
                if not self.pending.reaches(delivered):
                    break
                self.pending.take(2**62, 2**62, stop=delivered)  # sent already: dropped
                continue
            planned = self._plan.get(first)
            if planned and (final or self.pending.reaches(planned[0])):
                taken = self.pending.take(2**62, 2**62, stop=planned[0])
            elif planned is None and (final or self._due(now)):
                taken = self.pending.take(self.max_events, self.max_bytes)
            else:
                break
            cut.append(self._batch(taken, planned))
        return cut

    def acknowledged(self, batch: Batch) -> None:
        self._plan[batch.first] = (batch.stop, True)

    def passed(self, batch: Batch) -> None:
        """The cursor moved over the batch: it is never resent."""
        self._plan.pop(batch.first, None)
        ends_inside_a_record = batch.through < batch.stop[0]
        self._delivered_into = batch.stop if ends_inside_a_record else None

    def _due(self, now: float) -> bool:
        pending, since = self.pending, self.pending.since
        aged = since is not None and now - since >= self.interval_s
        return aged or len(pending) >= self.max_events or pending.size >= self.max_bytes

    def _batch(self, taken: Taken, planned: tuple[Position, bool] | None) -> Batch:
        if not taken.ends_record:
            through = taken.last[0] - 1
        elif len(self.pending):
            through = self.pending.position()[0] - 1
        else:
            through = self.seen_through or taken.last[0]
        key = idempotency_key(self.sink, self.spool_id, taken.first, taken.last,
                              taken.whole_records)
        stop = (taken.last[0], taken.last[1] + 1)
        acknowledged = planned == (stop, True)
        self._plan[taken.first] = (stop, acknowledged)
        return Batch(key, taken.first, stop, through, taken.events,
                     frame_body(taken.parts, self.body_format), planned is not None,
                     acknowledged)


def record_groups(records: Sequence[SpoolRecord], events: int) -> list[Sequence[SpoolRecord]]:
    """Consecutive slices of about `events` events each (at least one record per slice)."""
    groups, start, count = [], 0, 0
    for index, record in enumerate(records):
        if count and count + record.count > events:
            groups.append(records[start:index])
            start, count = index, 0
        count += record.count
    groups.append(records[start:])
    return groups
