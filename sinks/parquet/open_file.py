"""The one file a Parquet sink fills at a time, and what a call hands back to publish.

An `OpenFile` writes row groups straight to its staged path as they fill (at most one
row group of rows in memory); `finish()` closes it into a `ClosedFile` that the sink
publishes under its key.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa

from sinks.parquet.writer import open_writer
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA

NS_PER_HOUR: Final = 3600 * 1_000_000_000


@dataclass(slots=True)
class ClosedFile:
    key: str
    staged: Path
    last_offset: int
    events: int
    size: int  # bytes, counted once the file is published
    received_ns: int  # of its first record, which names its hour


@dataclass(slots=True)
class Progress:
    """What one call finished: files to publish, and filtered-out records before any file."""

    closed: list[ClosedFile] = field(default_factory=list)
    free_through: int | None = None


class OpenFile:
    """The file being filled: a ParquetWriter on the staged path, at most one row group
    of rows held in memory."""

    def __init__(
        self, key: str, staged: Path, first: SpoolRecord, opened_at: float, compression: str
    ) -> None:
        self.key = key
        self.staged = staged
        self.hour = first.received_ns // NS_PER_HOUR
        self.first_received_ns = first.received_ns
        self.opened_at = opened_at
        self.last_offset = first.offset
        self.events = 0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.sink = pa.OSFile(str(staged), "wb")
        try:
            self.writer = open_writer(self.sink, EVENT_SCHEMA, compression)
        except BaseException:
            self.sink.close()
            raise

    @property
    def bytes_written(self) -> int:
        return int(self.sink.tell())

    def add(self, table: pa.Table, offset: int, row_group_rows: int) -> None:
        self.pending.append(table)
        self.pending_rows += table.num_rows
        self.events += table.num_rows
        self.last_offset = offset
        if self.pending_rows >= row_group_rows:
            rows = pa.concat_tables(self.pending)
            whole = rows.num_rows - rows.num_rows % row_group_rows
            self.writer.write_table(rows.slice(0, whole), row_group_size=row_group_rows)
            rest = rows.slice(whole)
            self.pending = [rest] if rest.num_rows else []
            self.pending_rows = rest.num_rows

    def finish(self) -> ClosedFile:
        if self.pending_rows:
            self.writer.write_table(pa.concat_tables(self.pending))
        self.writer.close()
        size = self.bytes_written
        self.sink.close()
        return ClosedFile(self.key, self.staged, self.last_offset, self.events, size,
                           self.first_received_ns)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(Exception):
            self.sink.close()
        self.staged.unlink(missing_ok=True)
