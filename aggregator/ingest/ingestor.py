"""From accepted input to a spool record: decode in a worker thread, stamp, append.

Every ingest route (Unix socket frames, HTTP NDJSON, Ray Event Export, OTLP, the
agent's own heartbeats) ends here, so counting and spooling happen in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from aggregator.decode.columns import decode_columns
from aggregator.decode.ndjson import decode_ndjson
from aggregator.decode.normalize import Normalized, Stamp, ndjson_to_batch, rows_to_batch
from aggregator.disk_words import what_to_do
from aggregator.losses import LossRecorder, ProducerLoss, reported_losses
from aggregator.metrics import AgentMetrics
from aggregator.red.metrics import RedMetrics
from aggregator.spool import AppendResult, Spool, SpoolClosed, SpoolFull
from emitters.ratelimit import RateLimitedLog
from emitters.thread_names import name_this_thread
from emitters.wire import NO_SESSION
from sinks.schema import batch_to_bytes

T = TypeVar("T")
log = logging.getLogger("evagg.ingest")
LOGGED_REASON_CHARS = 300
SPLIT_FILL = 0.8  # a split record aims at this share of the limit: rows differ in size


# A batch's spool record, the losses its `loss` events report, what the watcher took
SpoolBytes = tuple[bytes, list[ProducerLoss], Any]


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    rejected: int
    duplicate: bool
    note: str  # the first rejection reason, or ""
    reasons: tuple[str, ...] = ()  # up to ten rejection reasons, for HTTP answers
    too_large: bool = False  # the whole batch is more than one spool record can hold


class BatchWatcher(Protocol):
    """Sees every stored batch: `extract` in the worker thread that builds the spool
    record, `apply` on the loop once the spool has it (aggregator/liveness/)."""

    def extract(self, batch: pa.RecordBatch) -> Any: ...

    def apply(self, found: Any) -> None: ...


class SpoolUnavailable(RuntimeError):
    """The spool could not write (disk full, I/O error): answer nothing, let producers resend.

    `retry_after_s` is the HTTP answer's Retry-After: 5, or 1 for a full spool whose
    request already waited its `room_wait_s` for room (an OTel SDK's export has 10 s in
    all by default: 5 s held and 5 s more to wait left it no second try)."""

    def __init__(self, text: str, retry_after_s: int = 5) -> None:
        super().__init__(text)
        self.retry_after_s = retry_after_s


class Ingestor:
    def __init__(self, spool: Spool, metrics: AgentMetrics, *, node_id: str, host: str,
                 decode_threads: int = 1, red: RedMetrics | None = None,
                 losses: LossRecorder | None = None) -> None:
        self.spool = spool
        self.losses = losses  # counts the losses producers report in `loss` events
        self.red = red  # RED metrics from every spooled batch (aggregator/red/metrics.py)
        self.metrics = metrics
        self.node_id = node_id
        self.host = host
        self.watcher: BatchWatcher | None = None  # set by the agent
        # One thread: decoding is mostly Python under the GIL, and a second thread only
        # traded the GIL with the first and the event loop. Measured (bench_pipeline.py,
        # docs/performance.md) it cost more CPU per event, and 10 MiB more RSS, than it
        # gained, on one core and on two alike.
        self._executor = ThreadPoolExecutor(decode_threads, thread_name_prefix="evagg-decode",
                                            initializer=name_this_thread)
        # refused events, said once a minute per route: a producer sending nothing but
        # bad events costs a line a minute, not one per batch
        self._rejections = RateLimitedLog(log)

    def stamp(self, pid: int | None = None, uid: int | None = None) -> Stamp:
        return Stamp(time.time_ns(), pid, uid, self.node_id, self.host)

    async def in_thread(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    async def ingest_frame(self, payload: bytes, stamp: Stamp, *, session: bytes, seq: int,
                           route: str = "socket") -> IngestResult:
        """A socket frame: the bulk decoder, with the careful path as its fallback."""
        if self.spool.has(session, seq):
            self.metrics.duplicate_frames.inc(route=route)
            return IngestResult(0, 0, True, "")
        normalized, prepared = await self.in_thread(
            self._decoded_for_spool, decode_ndjson, payload, stamp)
        return await self.store(normalized, stamp, route=route, session=session, seq=seq,
                                raw_bytes=len(payload), prepared=prepared)

    async def ingest_columns(self, payload: bytes, count: int, stamp: Stamp, *, session: bytes,
                             seq: int) -> IngestResult:
        """A COLUMNS socket frame; raises decode.columns.ColumnsRefused for a bad one."""
        if self.spool.has(session, seq):
            self.metrics.duplicate_frames.inc(route="socket")
            return IngestResult(0, 0, True, "")
        normalized, prepared = await self.in_thread(
            self._decoded_for_spool, decode_columns, payload, count, stamp)
        return await self.store(normalized, stamp, route="socket", session=session, seq=seq,
                                raw_bytes=len(payload), prepared=prepared)

    def _decoded_for_spool(self, decode: Callable[..., Normalized], *args: Any
                           ) -> tuple[Normalized, SpoolBytes | None]:
        """In the decode thread: a socket frame decoded and its spool record made in one
        hand-over, not two (each costs the loop and the thread a wake-up per frame)."""
        normalized = decode(*args)
        if normalized.batch.num_rows == 0:
            return normalized, None
        return normalized, _spool_bytes(normalized.batch, self._counts_losses("socket"),
                                        self.watcher)

    async def ingest_ndjson(self, body: bytes, stamp: Stamp, *, route: str,
                            room_wait_s: float | None = None) -> IngestResult:
        """An HTTP body of NDJSON lines or one JSON array."""
        is_array = body.lstrip()[:1] == b"["
        decode = ndjson_to_batch if is_array else decode_ndjson
        normalized = await self.in_thread(decode, body, stamp)
        return await self.store(normalized, stamp, route=route, raw_bytes=len(body),
                                room_wait_s=room_wait_s)

    async def ingest_rows(self, rows: Sequence[dict[str, Any]], stamp: Stamp, *, route: str,
                          extra_rejected: Sequence[tuple[int, str]] = (),
                          room_wait_s: float | None = None) -> IngestResult:
        """Event dicts built by a route's own mapping (Ray, OTLP, heartbeats)."""
        normalized = await self.in_thread(rows_to_batch, rows, stamp)
        normalized.rejected = sorted([*extra_rejected, *normalized.rejected])
        return await self.store(normalized, stamp, route=route, room_wait_s=room_wait_s)

    async def store(self, normalized: Normalized, stamp: Stamp, *, route: str,
                    session: bytes = NO_SESSION, seq: int = 0, raw_bytes: int = 0,
                    room_wait_s: float | None = None,
                    prepared: SpoolBytes | None = None) -> IngestResult:
        """Spool the batch. A full spool under `block` makes it wait for room: at most
        `room_wait_s` (an HTTP request: then SpoolUnavailable, a 503 to send again later),
        or as long as it takes (a socket frame: its producer waits for the ack)."""
        rejected = len(normalized.rejected)
        reasons = tuple(f"event {i}: {r}" for i, r in normalized.rejected[:10])
        batch = normalized.batch
        if rejected:
            self.metrics.rejected_events.inc(rejected, route=route)
            self._say_rejected(route, rejected, reasons[0], stamp.pid, kept=batch.num_rows)
        if batch.num_rows == 0:
            return IngestResult(0, rejected, False, normalized.first_reason(), reasons)
        if prepared is None:
            prepared = await self.in_thread(_spool_bytes, batch, self._counts_losses(route),
                                            self.watcher)
        payload, producer_losses, watched = prepared
        if producer_losses and session != NO_SESSION and self.losses is not None:
            # Counted now, not once stored: a spool full under `block` may hold this frame
            # until after its producer has exited (its last loss report comes on a fresh
            # connection for that reason). The reports' running totals keep a resend, or
            # the same losses in a later report, from counting twice.
            self.losses.count_from_producers(producer_losses)
            producer_losses = []
        records = [(payload, batch.num_rows)]
        limit = self.spool.max_record_bytes
        if len(payload) > limit and session == NO_SESSION:
            records = await self.in_thread(split_records, batch, limit, len(payload))
        # One event over the limit refuses the request before any part of it is stored:
        # appended first, the spool refuses it (ValueError below).
        oversized = [record for record in records if len(record[0]) > limit]
        try:
            for record, rows in oversized or records:
                result = await self._append(record, rows, stamp, route=route, session=session,
                                            seq=seq, room_wait_s=room_wait_s)
        except ValueError as exc:  # a record the spool can never hold: one huge event
            self.metrics.rejected_events.inc(batch.num_rows, route=route)
            reason = f"batch refused: {exc}; send it in smaller parts"
            self._say_rejected(route, batch.num_rows, reason, stamp.pid, kept=0)
            return IngestResult(0, rejected + batch.num_rows, False, reason,
                                (reason, *reasons[:9]), too_large=True)
        except OSError as exc:
            raise SpoolUnavailable(f"spool write failed: {exc.strerror or exc}") from exc
        except SpoolClosed as exc:  # the agent is stopping: the producer resends later
            raise SpoolUnavailable(str(exc)) from exc
        except SpoolFull as exc:  # no room within the wait: the producer resends later
            self.metrics.bad_input.inc(route=route, reason="spool_full")
            raise SpoolUnavailable(str(exc), retry_after_s=1) from exc
        if result.duplicate:
            self.metrics.duplicate_frames.inc(route=route)
            return IngestResult(0, 0, True, "")
        if self.watcher is not None:
            self.watcher.apply(watched)
        if self.red is not None and self.red.add_batch(batch):  # RED metrics, see red_metrics.py
            with contextlib.suppress(RuntimeError):  # executor shut down: /metrics flushes
                self._executor.submit(self.red.flush)  # off the event loop; never raises
        if producer_losses and self.losses is not None:
            self.losses.count_from_producers(producer_losses)
        self.metrics.received_events.inc(batch.num_rows, route=route)
        self.metrics.received_frames.inc(route=route)
        self.metrics.received_bytes.inc(raw_bytes or len(payload), route=route)
        return IngestResult(batch.num_rows, rejected, False, normalized.first_reason(), reasons)

    async def _append(self, record: bytes, rows: int, stamp: Stamp, *, route: str,
                      session: bytes, seq: int, room_wait_s: float | None) -> AppendResult:
        """A socket frame the disk refuses (full, or failing) waits and is written again
        once it can be: sent back to its producer, it would be lost, uncounted, had that
        producer exited meanwhile (docs/wire-protocol.md, "A producer that goes away").
        Any other route (HTTP's, the agent's own rows) gets the error at once: an HTTP
        request is answered 503, to send again."""
        failed = False
        while True:
            try:
                result = await self.spool.append(record, rows, received_ns=stamp.received_ns,
                                                 session=session, seq=seq,
                                                 room_wait_s=room_wait_s)
                # A try that wrote the record and then failed its fsync left it stored: this
                # frame's own, not a resend's.
                return AppendResult(result.offset, False) if failed else result
            except OSError as exc:
                if not failed:  # counted once per frame, however long it waits
                    self.metrics.bad_input.inc(route=route, reason="spool_write_failed")
                    failed = True
                if route != "socket":
                    raise
                self._rejections.log(
                    logging.ERROR, "disk", "spool write failed (%s): producers' frames wait "
                    "for the disk and are stored once it takes them; %s", exc.strerror or exc,
                    what_to_do(errno.errorcode.get(exc.errno or 0, "")))
            await self.spool.wait_for_disk()

    def _counts_losses(self, route: str) -> bool:
        """Whether the `loss` events of batches from `route` are counted here: producers'
        reports; the agent's own loss events are counted where they are made."""
        return self.losses is not None and route != "agent"

    def _say_rejected(self, route: str, count: int, first: str, pid: int | None, *,
                      kept: int) -> None:
        sender = f" from pid {pid}" if pid is not None else ""
        beside = (f"the {kept} good event{'' if kept == 1 else 's'} beside them were kept"
                  if kept else "nothing of that batch was stored")
        self._rejections.log(
            logging.WARNING, route, "refused %d bad event%s on %s%s: %s; the producer was told "
            "why, %s, and `evagg status` counts them as rejected", count,
            "" if count == 1 else "s", route, sender, first[:LOGGED_REASON_CHARS], beside)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _spool_bytes(batch: pa.RecordBatch, losses: bool,
                 watcher: BatchWatcher | None) -> SpoolBytes:
    """In a worker thread: the spool record, the losses its `loss` events report and
    what the watcher picks from it (computes over the batch that the event loop, which
    every connection shares, should not do)."""
    watched = watcher.extract(batch) if watcher is not None else None
    return batch_to_bytes(batch), reported_losses(batch) if losses else [], watched


def split_records(batch: pa.RecordBatch, limit: int, size: int) -> list[tuple[bytes, int]]:
    """A batch whose record of `size` bytes would pass the spool's limit (an HTTP body
    that grows past it once decoded: 14 MB of OTLP protobuf makes about 70 MB of
    columns) as several records of consecutive rows, each under the limit, so that no
    good event is refused for the company it came in. A single row over the limit stays
    one record, which the spool refuses."""
    parts = max(2, math.ceil(size / (limit * SPLIT_FILL)))
    step = math.ceil(batch.num_rows / parts)
    records: list[tuple[bytes, int]] = []
    for start in range(0, batch.num_rows, step):
        piece = batch.slice(start, step)
        record = batch_to_bytes(piece)
        if len(record) > limit and piece.num_rows > 1:
            records += split_records(piece, limit, len(record))
        else:
            records.append((record, piece.num_rows))
    return records
