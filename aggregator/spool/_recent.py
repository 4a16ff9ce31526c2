"""The newest records kept in memory as they were appended, so a sink that keeps up reads
them from here instead of back from the segment file the loop wrote a moment before.

Reading back cost the event loop about a sixth of its time under a busy producer (a
file open and read per batch, a CRC of every payload, a copy of every payload): the
bytes here are the very objects that were written, so none of that is needed. A reader
behind the tail, or one that starts before it, reads the segment files as before; the
records it gets are the same either way (tests/aggregator/spool/test_recent_tail.py).

The tail is bounded by payload bytes (`RECENT_BYTES`), and holds only consecutive
offsets: any gap (a record not written, a segment repaired) empties it.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from sinks.records import SpoolRecord

RECENT_BYTES: Final = 4 * 2**20  # about 11 of the pipeline bench's 367 kB records


class RecentRecords:
    def __init__(self, max_bytes: int = RECENT_BYTES, overhead: int = 0) -> None:
        self.max_bytes = max_bytes
        self.overhead = overhead  # bytes a record takes on disk beside its payload
        self._records: deque[SpoolRecord] = deque()
        self._bytes = 0

    def add(self, record: SpoolRecord) -> None:
        """Keep `record`, the one appended right after the newest kept (else start again)."""
        if self._records and record.offset != self._records[-1].offset + 1:
            self.clear()
        size = len(record.payload)
        if size > self.max_bytes:
            self.clear()
            return
        self._records.append(record)
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= len(self._records.popleft().payload)

    def clear(self) -> None:
        self._records.clear()
        self._bytes = 0

    def read(self, start: int, visible: int, max_bytes: int,
             max_records: int) -> list[SpoolRecord] | None:
        """The records from `start` up to `visible`, as a segment read gives them (each
        counted with its on-disk overhead against `max_bytes`, the first one always), or
        None when the tail does not hold `start`."""
        if not self._records:
            return None
        first = self._records[0].offset
        if not first <= start <= self._records[-1].offset:
            return None
        out: list[SpoolRecord] = []
        used = 0
        for i in range(start - first, len(self._records)):
            record = self._records[i]
            if record.offset > visible or len(out) >= max_records:
                break
            size = self.overhead + len(record.payload)
            if out and used + size > max_bytes:
                break
            used += size
            out.append(record)
        return out
