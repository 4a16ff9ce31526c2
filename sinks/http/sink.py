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
import warnings
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp
import numpy as np
import pyarrow as pa

from sinks.base import Sink, SinkCounter, SinkResult
from sinks.filters import EventFilter
from sinks.http.batches import Batch, Batcher, Body, gzip_body, record_groups
from sinks.http.body import encode_rows
from sinks.http.concurrency import Answer, ConcurrencyLimit
from sinks.http.deadletter import write_dead_letter
from sinks.http.endpoint import CONTENT_TYPES, url_for_display
from sinks.http.failures import (
    failure_for_error,
    failure_for_status,
    load_answer,
    load_answer_for_error,
    parse_retry_after,
)
from sinks.http.options import HttpOptions, check_url
from sinks.http.proxy import proxy_route
from sinks.http.retries import BatchRetry, FailureStreak, retried_here
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
REFUSAL_LOG_INTERVAL_S: Final = 60.0
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
        self._ssl = client_ssl(options.tls)  # checked now: a bad file fails the start
        route = proxy_route(url, options.proxy)
        proxy_headers, self._proxy = route.for_endpoint(url)
        self._via = route.describe()
        self.url, self.spool_id, self.options = url, spool_id, options
        self.body_format, self.gzip = options.body_format, options.gzip
        self.timeout_s, self.max_in_flight = options.timeout_s, options.max_in_flight
        self.max_retry_backoff_s = max_retry_backoff_s  # caps each batch's own backoff too
        self.event_filter = event_filter or EventFilter()
        self.dead_letter_dir = dead_letter_dir  # None: a permanent 4xx stops the sink instead
        # private: never in repr or describe
        self.__headers = {**options.headers, **proxy_headers}
        self.gzip_level = options.gzip_level
        self._session: aiohttp.ClientSession | None = None
        # kept across abandon(): the endpoint is the same
        self._limit = ConcurrencyLimit(options.max_in_flight, fixed=options.concurrency)
        self._streak = FailureStreak()
        self._counters: Counter[str] = Counter()
        self._last_refusal_log = -REFUSAL_LOG_INTERVAL_S
        self._batcher = Batcher(name, spool_id, options.body_format, options.batch_max_events,
                                options.batch_max_bytes, options.batch_interval_s)
        self._reset()

    def _reset(self) -> None:
        self._batcher.reset()
        self._flights: deque[_Flight] = deque()
        self._failure: SinkResult | None = None  # for the loop; set, nothing new is sent
        self._halted = asyncio.Event()  # set with _failure: wakes batches in their backoff
        self._durable: int | None = None
        self._reported: int | None = None
        self._delivered = 0
        self._answered = False  # a request was answered 2xx since the last result

    def __repr__(self) -> str:
        return f"HttpSink(name={self.name!r}, url={url_for_display(self.url)!r})"

    def describe(self) -> str:
        encoding = f"{self.body_format}{', gzip' if self.gzip else ''}"
        flight = (f"up to {self.max_in_flight} in flight, adaptive" if self._limit.adaptive
                  else f"{self._limit.limit} in flight")
        return f"http {url_for_display(self.url)} ({encoding}, {flight}{self._via})"

    def metrics(self) -> dict[str, int]:
        """Counters since start: requests by status class, retries, dead letters, bytes."""
        return {name: self._counters[name] for name in _METRICS}

    def gauges(self) -> dict[str, float]:
        """The concurrency limit, the requests in flight, and the moving average of the
        endpoint's answer latency (0 before the first answer)."""
        limit = self._limit
        return {"concurrency_limit": float(limit.limit), "requests_in_flight": float(
            limit.in_flight), "answer_latency_seconds": limit.latency_s or 0.0}

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
        self._halt(SinkResult.failure("abandoned by the delivery loop", "skipped"))
        running = self._running()
        if running:
            await asyncio.wait(running)
        self._collect()
        self._reset()

    async def close(self) -> None:
        running = self._running()
        for task in running:  # shutting down: the drain deadline has passed
            task.cancel()
        if running:
            await asyncio.wait(running)
        self._reset()
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        """Queue due batches; they wait for a slot in `_post`, so the caller can encode the
        next records meanwhile. Waits while too many are queued or cut ahead."""
        for batch in self._batcher.cut(final, time.monotonic()):
            flight = _Flight(batch, done=batch.acknowledged)
            self._flights.append(flight)
            self._counters["retries"] += int(batch.resend and not batch.acknowledged)
            if not flight.done and self._failure is None:
                flight.task = asyncio.create_task(self._post(batch))
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
                self._halt(outcome)

    def _report(self) -> SinkResult:
        """Progress first; a failure is returned once there is no progress left to report.
        `peer_ok` tells the loop the endpoint answered, whether or not the cursor moved."""
        answered, self._answered = self._answered, False
        if self._durable is not None and self._durable != self._reported:
            self._reported, delivered, self._delivered = self._durable, self._delivered, 0
            return SinkResult.success(self._durable, delivered, peer_ok=answered)
        return self._failure or SinkResult.success(peer_ok=answered)

    def _halt(self, failure: SinkResult) -> None:
        """Hand `failure` to the loop; batches not on the wire stop where they are."""
        if self._failure is None:
            self._failure = failure
        self._halted.set()

    async def _post(self, batch: Batch) -> SinkResult | None:
        """Send one batch until it is answered 2xx or dead-lettered (then None), retrying a
        passing failure after the batch's own backoff. A failure returned is the loop's:
        every request is failing, or it is no passing trouble of the endpoint."""
        headers = {**self.__headers, "Content-Type": CONTENT_TYPES[self.body_format],
                   "Idempotency-Key": batch.key, "User-Agent": "evagg"}
        retry = BatchRetry(self.max_retry_backoff_s)
        try:
            body = batch.body
            if self.gzip:  # before taking a slot: queued batches compress on other cores
                body = await asyncio.to_thread(gzip_body, body, self.gzip_level)
                headers["Content-Encoding"] = "gzip"
            while True:
                result = await self._attempt(batch, body, headers, resend=retry.failures > 0)
                if result is None or self._failure is not None:
                    return result
                if not retried_here(result) or self._streak.down:
                    break
                if not await self._backoff(retry.delay_after(result)):
                    return _NOT_SENT
                self._counters["retries"] += 1
        except Exception as exc:  # a sink never raises into the loop
            log.exception("sink %s: unexpected error sending a batch", self.name)
            result = self._failed("internal_errors", SinkResult.failure(
                f"internal error: {type(exc).__name__}", "internal"))
        self._halt(result)
        return result

    async def _attempt(self, batch: Batch, body: Body,
                       headers: dict[str, str], *, resend: bool) -> SinkResult | None:
        """One request in one slot; the answer goes to the concurrency limit and the streak."""
        ticket = await self._limit.acquire(retry=resend)
        answer = Answer.NEUTRAL
        try:
            if self._failure is not None:  # halted while waiting: the loop resends
                return _NOT_SENT
            result, answer = await self._request(batch, body, headers)
        finally:
            self._limit.release(ticket, answer)
        if result is None:
            self._streak.answered()
        elif retried_here(result):
            self._streak.failed()
        return result

    async def _backoff(self, seconds: float) -> bool:
        """Wait out a batch's backoff; False when the sink halted meanwhile."""
        try:
            async with asyncio.timeout(seconds):
                await self._halted.wait()
        except TimeoutError:
            return True
        return False

    async def _request(self, batch: Batch, body: Body,
                       headers: dict[str, str]) -> tuple[SinkResult | None, Answer]:
        with warnings.catch_warnings():  # aiohttp warns on bodies over 1 MiB; ours are bounded
            warnings.simplefilter("ignore", ResourceWarning)
            payload = aiohttp.payload.BytesPayload(body, content_type=headers["Content-Type"])
        try:
            async with self._client().post(self.url, data=payload, headers=headers,
                                           allow_redirects=False, **self._proxy) as response:
                status = response.status
                text = (await response.read()).decode(errors="replace")
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
        except (TimeoutError, aiohttp.ClientError) as exc:
            failure = self._failed(*failure_for_error(exc, self.timeout_s))
            return failure, load_answer_for_error(failure)
        self._counters[f"requests_{min(status // 100, 5)}xx"] += 1
        self._counters["bytes_sent"] += len(body)
        if 200 <= status < 300:
            self._counters["events_sent"] += batch.events
            self._answered = True
            return None, load_answer(status)
        refused = failure_for_status(status, retry_after)
        if refused is None:  # the batch itself is refused: kept aside, the cursor moves on
            return await self._dead_letter(batch, status, text), load_answer(status)
        return refused, load_answer(status)

    async def _dead_letter(self, batch: Batch, status: int, text: str) -> SinkResult | None:
        if self.dead_letter_dir is None:
            return SinkResult.failure(f"HTTP {status} and no dead-letter directory", "http_4xx",
                                      permanent=True)
        try:
            letter = await asyncio.to_thread(
                write_dead_letter, self.dead_letter_dir, key=batch.key, body=batch.body,
                status=status, response=text, url=self.url, events=batch.events,
                body_format=self.body_format, sink=self.name, first_offset=batch.first[0],
                last_offset=batch.stop[0])
        except OSError as exc:
            return SinkResult.failure(f"HTTP {status} and the dead letter failed: {exc.strerror}",
                                      "dead_letter")
        self._counters["dead_lettered_batches"] += 1
        self._counters["dead_lettered_events"] += batch.events
        now = time.monotonic()
        if now - self._last_refusal_log >= REFUSAL_LOG_INTERVAL_S:  # a log line, not a flood
            log.warning("sink %s: %s refused %d events with HTTP %d; kept in %s (%d batches "
                        "dead-lettered so far)", self.name, url_for_display(self.url),
                        batch.events, status, letter.body_path,
                        self._counters["dead_lettered_batches"])
            self._last_refusal_log = now
        return None

    def _failed(self, counter: str, failure: SinkResult) -> SinkResult:
        self._counters[counter] += 1
        self._counters["requests_failed"] += 1
        return failure

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=self.max_in_flight,
                                               ssl=True if self._ssl is None else self._ssl))
        return self._session


_NOT_SENT: Final = SinkResult.failure("not sent: the sink stopped for the delivery loop",
                                     "skipped")
_METRICS: Final = ("requests_2xx", "requests_3xx", "requests_4xx", "requests_5xx",
                   "requests_failed", "timeouts", "connect_errors", "tls_errors",
                   "internal_errors", "retries", "dead_lettered_batches", "dead_lettered_events",
                   "bytes_sent", "events_sent")

