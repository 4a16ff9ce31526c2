"""The Parquet sink: spool records into Hive-partitioned Parquet files in an ObjectStore.

One file is open at a time. It rolls when it reaches `roll_max_bytes` (checked as row
groups reach the disk), when `roll_interval_s` has passed since it opened (checked in
`flush()`), when the UTC hour of a record's receive time changes, and on the final flush.
Rolling closes the file, publishes it, and reports its last offset as durable.

The object key derives from the file's first record alone (its offset and its receive
hour), so after a crash or an `abandon()` the resent records rebuild a file under the
same key and replace the earlier one: a spool range lands in the store once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import pyarrow as pa

from sinks.base import Sink, SinkCounter, SinkResult
from sinks.filters import EventFilter
from sinks.parquet.counts import METRIC_HELP, ParquetCounts
from sinks.parquet.hour_compaction import METRIC_HELP as COMPACTION_METRIC_HELP
from sinks.parquet.hour_compaction import HourCompaction
from sinks.parquet.layout import object_key
from sinks.parquet.open_file import NS_PER_HOUR, ClosedFile, OpenFile, Progress
from sinks.parquet.options import ParquetOptions
from sinks.parquet.s3 import METRIC_HELP as S3_METRIC_HELP
from sinks.parquet.stores import ObjectStore, StoreError
from sinks.records import SpoolRecord
from sinks.schema import batch_from_bytes

log = logging.getLogger("evagg.sinks.parquet")



class _DecodeError(Exception):
    """A spool record whose payload is not an EVENT_SCHEMA batch."""


class ParquetSink(Sink):
    sink_type = "parquet"
    metric_help: ClassVar[Mapping[str, str]] = {**METRIC_HELP, **S3_METRIC_HELP,
                                                 **COMPACTION_METRIC_HELP}

    def __init__(
        self,
        name: str,
        store: ObjectStore,
        options: ParquetOptions = ParquetOptions(),  # noqa: B008 -- frozen, never changed
        *,
        node_id: str,
        spool_id: str,
        event_filter: EventFilter | None = None,
        compression: str = "zstd",
        clock: Callable[[], float] = time.monotonic,
        compaction: HourCompaction | None = None,
    ) -> None:
        super().__init__(name)
        if not node_id or not spool_id:
            raise ValueError("node_id and spool_id must not be empty")
        self.store = store
        self.node_id = node_id
        self.spool_id = spool_id
        self.options = options  # the store's (options.s3) were given to the store
        self.roll_max_bytes = options.roll_max_bytes
        self.roll_interval_s = options.roll_interval_s
        self.row_group_rows = options.row_group_rows
        self.event_filter = event_filter or EventFilter()
        self.compression = compression
        self.counts = ParquetCounts()  # exported through counters()
        self.compaction = compaction  # merges the hours this sink has moved past
        self._clock = clock
        self._lock = threading.Lock()  # a cancelled call's thread may still be running
        self._file: OpenFile | None = None
        self._unpublished: list[ClosedFile] = []
        self._staging_cleaned = False
        # The last offset of a file whose publish failed: the file the loop's resend
        # rebuilds is due once it holds as much, not a roll interval after it opens (a
        # minute on S3, which an outage's recovery would otherwise wait for).
        self._failed_through: int | None = None

    def describe(self) -> str:
        return f"parquet {self.store.describe()} node={self.node_id}"

    def counters(self) -> list[SinkCounter]:
        merged = self.compaction.counters() if self.compaction else []
        return [*self.counts.as_counters(), *self.store.counters(), *merged]

    def gauges(self) -> dict[str, float]:
        """What is not in the lake yet: the events in the open file, and the seconds until
        it closes (0 with no file open), read without the lock: a value a moment old. And
        the closed hours whose merge failed (`partitions_not_merged`), with compaction on."""
        merges = self.compaction.gauges() if self.compaction else {}
        current = self._file
        if current is None:
            return {"open_file_events": 0.0, "file_closes_in_seconds": 0.0, **merges}
        left = current.opened_at + self.roll_interval_s - self._clock()
        return {"open_file_events": float(current.events),
                "file_closes_in_seconds": max(left, 0.0), **merges}

    async def write(self, records: Sequence[SpoolRecord]) -> SinkResult:
        return await self._run(self._append, records)

    async def flush(self, *, final: bool = False) -> SinkResult:
        if self.compaction is not None and not final:
            self.compaction.poke()
        return await self._run(self._roll_if_due, final)

    async def abandon(self) -> None:
        await asyncio.to_thread(self._discard)

    async def close(self) -> None:
        if self.compaction is not None:
            self.compaction.stop()
        await self.abandon()  # anything still open missed its final flush

    async def _run(self, step: Callable[..., Progress], *args: object) -> SinkResult:
        phase = "write"
        try:
            progress = await asyncio.to_thread(step, *args)
            phase = "publish"
            return await self._publish(progress)
        except Exception as exc:
            return await self._failed(phase, exc)

    async def _publish(self, progress: Progress) -> SinkResult:
        durable: int | None = None
        events = 0
        for closed in progress.closed:
            self._failed_through = closed.last_offset  # until it is published
            await self.store.publish(closed.staged, closed.key)
            self._failed_through = None
            self.counts.file_published(closed.size, closed.events)
            if self.compaction is not None:
                self.compaction.file_published(closed.received_ns)
            with contextlib.suppress(ValueError):  # abandon() may have cleared the list
                self._unpublished.remove(closed)
            durable, events = closed.last_offset, events + closed.events
        if progress.free_through is not None:
            durable = max(durable or 0, progress.free_through)
        return SinkResult.success(durable_through=durable, delivered_events=events)

    async def _failed(self, phase: str, exc: Exception) -> SinkResult:
        kind = _error_kind(phase, exc)
        if self.counts.failed(phase, kind) == 1:
            log.warning("parquet sink %s: %s failed: %r", self.name, kind, exc)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._discard)  # the loop resends from its cursor
        if isinstance(exc, StoreError):
            return SinkResult.failure(str(exc)[:300], kind, permanent=exc.permanent,
                                      retry_after_s=exc.retry_after_s)
        return SinkResult.failure(
            f"{type(exc).__name__}: {exc}"[:300], kind, permanent=kind in _PERMANENT_KINDS
        )

    # The methods below run in a worker thread, one at a time.

    def _append(self, records: Sequence[SpoolRecord]) -> Progress:
        progress = Progress()
        with self._lock:
            self._clean_staging_once()
            for record in records:
                table = self._decode(record)
                if table.num_rows == 0:
                    if self._file is None:
                        progress.free_through = record.offset
                    else:
                        self._file.last_offset = record.offset
                    continue
                if self._file is not None and self._file.hour != record.received_ns // NS_PER_HOUR:
                    progress.closed.append(self._close_file())
                if self._file is None:
                    self._file = self._open_file(record)
                self._file.add(table, record.offset, self.row_group_rows)
                if self._file.bytes_written >= self.roll_max_bytes:
                    progress.closed.append(self._close_file())
        return progress

    def _roll_if_due(self, final: bool) -> Progress:
        progress = Progress()
        with self._lock:
            current = self._file
            retried = self._failed_through
            if current is not None and (
                final or self._clock() - current.opened_at >= self.roll_interval_s
                or (retried is not None and current.last_offset >= retried)
            ):
                progress.closed.append(self._close_file())
        return progress

    def _clean_staging_once(self) -> None:
        """Delete what a crashed run left staged, before this run stages its first file."""
        if self._staging_cleaned:
            return
        self._staging_cleaned = True
        try:
            removed = self.store.cleanup_staging()
        except Exception as exc:  # leftovers only cost disk space: deliver anyway
            log.warning("parquet sink %s: cleaning staged files failed: %r", self.name, exc)
            return
        if removed:
            log.info("parquet sink %s: deleted %d stale staged files", self.name, removed)

    def _decode(self, record: SpoolRecord) -> pa.Table:
        try:
            batch = batch_from_bytes(record.payload)
        except Exception as exc:
            raise _DecodeError(f"record {record.offset}: {exc}") from exc
        return self.event_filter.apply(pa.Table.from_batches([batch]))

    def _open_file(self, first: SpoolRecord) -> OpenFile:
        key = object_key(first.received_ns, self.node_id, self.spool_id, first.offset)
        staged = self.store.staging_path(key)
        return OpenFile(key, staged, first, self._clock(), self.compression)

    def _close_file(self) -> ClosedFile:
        current, self._file = self._file, None
        assert current is not None
        try:
            closed = current.finish()
        except BaseException:
            current.discard()
            raise
        self._unpublished.append(closed)
        return closed

    def _discard(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.discard()
                self._file = None
            for closed in self._unpublished:
                closed.staged.unlink(missing_ok=True)
            self._unpublished.clear()


def _error_kind(phase: str, exc: Exception) -> str:
    if isinstance(exc, _DecodeError):
        return "decode"
    if isinstance(exc, StoreError):
        return exc.kind
    if phase == "publish":
        return "publish"
    if isinstance(exc, OSError):
        if exc.errno in _REFUSED_ERRNOS:
            return "permission"
        return "disk_full" if exc.errno == errno.ENOSPC else "io"
    return "internal"


# A directory the agent may not write, or a read-only filesystem: retrying soon will not
# help, and `evagg_sink_permanent_error` says so (an operator fixes the mode or the unit's
# ReadWritePaths=), where a full disk or a flaky one may pass.
_REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_PERMANENT_KINDS = frozenset({"decode", "permission"})
