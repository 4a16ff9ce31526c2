"""The HTTP sink: spool records -> JSON batches POSTed with a stable Idempotency-Key.

Batches are cut by count, bytes and age from rows encoded straight from Arrow
(`sinks.http.body`). The POSTs in flight follow the endpoint (`sinks.http.concurrency`,
up to `max_in_flight`), but `durable_through` only moves past a batch once it and every
batch before it were answered 2xx (or dead-lettered), so the cursor never skips an
unacknowledged event. A batch whose request failed with a 5xx, 429, timeout or
connection error waits out its own backoff and is sent again alone (`sinks.http.retries`);
the other requests carry on and none in flight is cancelled for it. Only an endpoint
that fails every request, or a failure that is no passing trouble (credentials, a dead
letter that cannot be written), goes to the delivery loop, which backs off, abandons and
sends again from its cursor. Batch boundaries and answers are remembered across
`abandon()`, so a resent batch has the same rows and the same key, derived from (sink,
spool id, first offset, last offset), and a batch answered 2xx is never sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa

from sinks.base import Sink, SinkCounter, SinkResult
from sinks.filters import EventFilter
from sinks.http.batches import Batch, Batcher, record_groups
from sinks.http.body import encode_rows
from sinks.http.deadletter import WaitingEvents
from sinks.http.endpoint import url_for_display
from sinks.http.metric_help import METRIC_HELP
from sinks.http.options import HttpOptions, check_url
from sinks.http.proxy import proxy_route
from sinks.http.sender import Halt, Sender
from sinks.http.tls import client_ssl
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_from_bytes

log = logging.getLogger("evagg.sinks.http")
MIB: Final = 1024 * 1024
# Batches queued for a slot (per slot, and bytes in all): enough to keep the slots busy
# while the next records are encoded, few enough to bound memory.
QUEUED_PER_SLOT: Final = 8
QUEUED_MAX_BYTES: Final = 64 * MIB
# Batches cut ahead of the cursor at most, answered ones included: a batch retried for
# long holds the cursor, and the bodies answered behind it are let go, not their count.
AHEAD_PER_SLOT: Final = 4 * QUEUED_PER_SLOT
ENCODE_GROUP_EVENTS: Final = 65_536  # records encoded at once: bounds memory per write()


@dataclass(slots=True)
class _Flight:
    """One batch between being cut and being answered, in cursor order."""

    batch: Batch
    task: asyncio.Task[SinkResult | None] | None = None
    done: bool = False  # answered 2xx or dead-lettered


class HttpSink(Sink):
    """POSTs JSON batches of events; see the module docstring and docs/sinks-http.md."""

    # 1 MiB reads keep catch-up after an outage at flat memory (bench/bench_catchup.py:
    # peak anonymous memory 110-135 MiB with 4 MiB reads, 68-70 MiB with 1 MiB, same drain).
    read_max_bytes = 1 * MIB
    sink_type = "http"
    metric_help = METRIC_HELP

    def __init__(
        self,
        name: str,
        url: str,
        options: HttpOptions = HttpOptions(),  # noqa: B008 -- frozen, never changed
        *,
        spool_id: str,
        max_retry_backoff_s: float = 60.0,  # the config's retry_max_backoff
        event_filter: EventFilter | None = None,
        dead_letter_dir: Path | None = None,
    ) -> None:
        super().__init__(name)
        check_url(url, options)
        ssl = client_ssl(options.tls)  # checked now: a bad file fails the start
        route = proxy_route(url, options.proxy)
        proxy_headers, proxy = route.for_endpoint(url)
        self._via = route.describe()
        self.url, self.spool_id, self.options = url, spool_id, options
        self.body_format, self.gzip, self.gzip_level = (options.body_format, options.gzip,
                                                        options.gzip_level)
        self.timeout_s, self.max_in_flight = options.timeout_s, options.max_in_flight
        self.event_filter = event_filter or EventFilter()
        # max_retry_backoff_s caps each batch's own backoff too
        self._sender = Sender(name, url, options, headers={**options.headers, **proxy_headers},
                              proxy=proxy, ssl=ssl, dead_letter_dir=dead_letter_dir,
                              max_retry_backoff_s=max_retry_backoff_s)
        self._dead_letters = WaitingEvents(dead_letter_dir) if dead_letter_dir else None
        self._batcher = Batcher(name, spool_id, options.body_format, options.batch_max_events,
                                options.batch_max_bytes, options.batch_interval_s)
        self._reset()

    def _reset(self) -> None:
        self._batcher.reset()
        self._flights: deque[_Flight] = deque()
        self._halt = Halt()  # its failure is the loop's; once set, nothing new is sent
        self._durable: int | None = None
        self._reported: int | None = None
        self._delivered = 0

    @property
    def _failure(self) -> SinkResult | None:
        return self._halt.failure

    def __repr__(self) -> str:
        return f"HttpSink(name={self.name!r}, url={url_for_display(self.url)!r})"

    def describe(self) -> str:
        encoding = f"{self.body_format}{', gzip' if self.gzip else ''}"
        limit = self._sender.limit
        flight = (f"up to {self.max_in_flight} in flight, adaptive" if limit.adaptive
                  else f"{limit.limit} in flight")
        return f"http {url_for_display(self.url)} ({encoding}, {flight}{self._via})"

    def metrics(self) -> dict[str, int]:
        """Counters since start: requests by status class, retries, dead letters, bytes."""
        return {name: self._sender.counters[name] for name in _METRICS}

    def gauges(self) -> dict[str, float]:
        """The concurrency limit, the requests in flight, the moving average of the
        endpoint's answer latency (0 before the first answer), the events waiting in
        dead letters (until `evagg dlq replay` sends them), and the `file:` headers whose
        file is gone, unreadable or empty now."""
        limit = self._sender.limit
        gauges = {"concurrency_limit": float(limit.limit), "requests_in_flight": float(
            limit.in_flight), "answer_latency_seconds": limit.latency_s or 0.0}
        if self._dead_letters is not None:
            gauges["dead_letters_waiting_events"] = float(self._dead_letters.events())
        if self._sender.header_files.files:  # sent with the value read before, meanwhile
            gauges["header_files_unusable"] = float(len(self._sender.header_files.unusable))
        # Requests fail before the delivery loop hears of it (the sink retries each one,
        # and tells the loop after DOWN_AFTER in a row): `evagg status` says so meanwhile.
        gauges["requests_failing_since_timestamp_seconds"] = self._sender.streak.since
        # Requests that fail between answered ones make no streak: the last minutes' counts
        # say so (`evagg status`: "ok, but 41 of its 62 requests ... failed").
        gauges.update(self._sender.recent.gauges())
        return gauges

    def counters(self) -> list[SinkCounter]:
        return [SinkCounter(name, value) for name, value in self.metrics().items()]

    async def write(self, records: Sequence[SpoolRecord]) -> SinkResult:
        if self._failure is not None:
            return self._report()
        for group in record_groups(records, ENCODE_GROUP_EVENTS) if records else [records]:
            try:
                if group:
                    await asyncio.to_thread(self._take_records, group)
            except Exception as exc:  # a record the encoder cannot read: a bug, not an outage
                log.exception("sink %s: cannot encode records %d-%d", self.name,
                              group[0].offset, group[-1].offset)
                return SinkResult.failure(f"cannot encode records: {type(exc).__name__}",
                                          "encode", permanent=True)
            await self._send_due(final=False)  # the next group encodes while these go out
            if self._failure is not None:
                break
        return self._report()

    async def flush(self, *, final: bool = False) -> SinkResult:
        self._sender.say_held_refusals()
        if self._failure is None:
            await self._send_due(final=final)
        if final:
            running = self._running()
            if running:
                await asyncio.wait(running)
            self._harvest()
        return self._report()

    async def abandon(self) -> None:
        """Send nothing new; requests on the wire finish (within `timeout_s`) and their
        answers count, so a batch answered 2xx now is not sent again after the backoff."""
        self._halt.stop(SinkResult.failure("abandoned by the delivery loop", "skipped"))
        running = self._running()
        if running:
            await asyncio.wait(running)
        self._collect()
        self._reset()

    async def close(self) -> None:
        self._sender.say_held_refusals(at_close=True)
        running = self._running()
        for task in running:  # shutting down: the drain deadline has passed
            task.cancel()
        if running:
            await asyncio.wait(running)
        self._reset()
        await self._sender.close()

    def _take_records(self, records: Sequence[SpoolRecord]) -> None:
        """Decode, filter and encode records (in a worker thread: Arrow releases the GIL)."""
        batches = [batch_from_bytes(r.payload) for r in records]
        table = pa.Table.from_batches(batches, schema=EVENT_SCHEMA)
        row_offsets = np.repeat(np.array([r.offset for r in records], np.int64),
                                [b.num_rows for b in batches])
        if not self.event_filter.keeps_all and table.num_rows:
            table = table.append_column("__row", pa.array(np.arange(table.num_rows)))
            table = self.event_filter.apply(table)
            row_offsets = row_offsets[table.column("__row").to_numpy()]
            table = table.drop_columns(["__row"])
        self._batcher.add(encode_rows(table), row_offsets, records[0].offset, records[-1].offset,
                          time.monotonic())

    async def _send_due(self, *, final: bool) -> None:
        """Queue due batches; they wait for a slot in the sender, so the caller can encode
        the next records meanwhile. Waits while too many are queued or cut ahead."""
        for batch in self._batcher.cut(final, time.monotonic()):
            flight = _Flight(batch, done=batch.acknowledged)
            self._flights.append(flight)
            if not flight.done and self._failure is None:
                flight.task = asyncio.create_task(self._sender.send(batch, self._halt))
        self._harvest()
        while self._failure is None and self._backlogged():
            running = self._running()
            if not running:
                break
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            self._harvest()

    def _backlogged(self) -> bool:
        slots = self.max_in_flight
        waiting = [f.batch for f in self._flights if not f.done]
        queued = sum(len(batch.body) for batch in waiting)
        return (len(waiting) > QUEUED_PER_SLOT * slots
                or (queued > QUEUED_MAX_BYTES and len(waiting) > slots)
                or len(self._flights) > AHEAD_PER_SLOT * slots)

    def _running(self) -> list[asyncio.Task[SinkResult | None]]:
        return [f.task for f in self._flights if f.task is not None and not f.task.done()]

    def _harvest(self) -> None:
        """Collect finished POSTs; advance the durable point over the contiguous done prefix."""
        self._collect()
        while self._flights and self._flights[0].done:
            batch = self._flights.popleft().batch
            self._durable, self._delivered = batch.through, self._delivered + batch.events
            self._batcher.passed(batch)
            self._sender.passed(batch)
        seen = self._batcher.seen_through
        if not self._flights and not len(self._batcher.pending) and seen is not None:
            self._durable = seen  # records the filter dropped entirely

    def _collect(self) -> None:
        """Mark the batches answered 2xx or dead-lettered, so none is ever sent again."""
        for flight in self._flights:
            task = flight.task
            if flight.done or task is None or not task.done() or task.cancelled():
                continue
            outcome = task.result()
            if outcome is None:
                flight.done = True
                self._batcher.acknowledged(flight.batch)
                flight.batch.body = b""  # answered: only its place in the order is needed
            else:
                self._halt.stop(outcome)

    def _report(self) -> SinkResult:
        """Progress first; a failure is returned once there is no progress left to report.
        `peer_ok` tells the loop the endpoint answered, whether or not the cursor moved."""
        answered, self._sender.answered = self._sender.answered, False
        if self._durable is not None and self._durable != self._reported:
            self._reported, delivered, self._delivered = self._durable, self._delivered, 0
            return SinkResult.success(self._durable, delivered, peer_ok=answered)
        return self._failure or SinkResult.success(peer_ok=answered)


_METRICS: Final = ("requests_2xx", "requests_3xx", "requests_4xx", "requests_5xx",
                   "requests_failed", "timeouts", "connect_errors", "tls_errors",
                   "internal_errors", "retries", "dead_lettered_batches", "dead_lettered_events",
                   "bytes_sent", "events_sent", "split_batches")

