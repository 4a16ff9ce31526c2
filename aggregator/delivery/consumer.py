"""One consumer per sink, each with its own cursor in the spool.

A slow or failing sink holds back only itself: its cursor stays put, the spool keeps
its records, the other consumers carry on. The cursor moves only past records the sink
reported durable. After any failure the consumer abandons the sink's buffered state,
backs off (exponential, full jitter, honouring Retry-After) and starts again from the
committed cursor. The backoff is for a sink that is down: a sink that retries its own
requests (HTTP) reports a failure only when every request fails or one cannot be
retried, so `failures_in_a_row` counts failed attempts in a row, and one success ends
the run, whether or not the cursor moved.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from aggregator.delivery.flaps import FlapWords
from aggregator.delivery.progress import DeliveryProgress
from aggregator.log_format import utc_clock
from aggregator.metrics import AgentMetrics
from aggregator.spool import RecordScreen, Spool
from aggregator.worker_errors import WorkerErrors
from sinks.backoff import backoff_delay
from sinks.base import Sink, SinkResult

log = logging.getLogger("evagg.delivery")

PERMANENT_RETRY_S = 60.0  # a permanent error is retried slowly; the spool keeps the data
DRAIN_RETRY_S = 1.0  # while draining, retries come at least this often
PERMANENT_HINT = " (a permanent error: fix the sink's config, credentials or bucket)"


STILL_FAILING_EVERY_S = 600.0  # a sink that stays down is said again this often


@dataclass
class ConsumerState:
    last_error_kind: str | None = None  # to log a failure once per change of kind
    failures_in_a_row: int = 0  # drives the backoff; a success resets it
    # exported: when the sink last delivered, or, before its first delivery, when it was
    # started, so that a sink that never delivers is seen too (0 until the SinkSet sets it)
    last_success_ns: int = 0
    failing_since_ns: int = 0  # when the current run of failed attempts began; 0: delivering
    reminded_at: float = 0.0  # monotonic: when the log last said this sink fails


class SinkConsumer:
    def __init__(self, sink: Sink, spool: Spool, metrics: AgentMetrics, *,
                 flush_interval_s: float = 1.0, read_max_bytes: int = 4 * 2**20,
                 backoff_cap_s: float = 60.0, screen: RecordScreen | None = None) -> None:
        self.sink = sink
        self.spool = spool
        self.screen = screen or RecordScreen(spool)  # share one per spool: counted once
        self.metrics = metrics
        self._errors = WorkerErrors(metrics, log)
        self.flush_interval_s = flush_interval_s
        self.read_max_bytes = read_max_bytes
        self.backoff_cap_s = backoff_cap_s
        self.state = ConsumerState()
        self._position = spool.cursor(sink.name)
        self._last_flush = time.monotonic()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._draining = False
        self._finishing = False  # a reload replaces the sink: flush once, then stop
        self._drain_ends: float | None = None  # monotonic deadline of the drain, if known
        self._said_down_while_draining = False
        self._flaps = FlapWords()  # which failures and recoveries the log says
        self.progress = DeliveryProgress()  # the running attempt, the minute's rate (/metrics)
        # A sample from the start, so a dashboard shows a healthy sink as 0, not "No data".
        metrics.sink_permanent_error.set(0, sink=sink.name)

    @property
    def name(self) -> str:
        return self.sink.name

    @property
    def draining(self) -> bool:
        return self._draining

    def caught_up(self) -> bool:
        return self.spool.cursor(self.name) >= self.spool.next_offset

    async def run(self) -> None:
        """Deliver until stopped. Never raises: failures are counted and retried."""
        while not self._stopping.is_set():
            try:
                result = await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a sink bug must not end delivery for good
                self._count_exception(exc, "write")
                result = SinkResult.failure(f"{type(exc).__name__}: {exc}", "exception")
            if result is None or result.ok:
                continue
            try:
                await self._recover(result)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # abandon() failed (a read-only disk, say): retry later
                self._count_exception(exc, "abandon")
                self._position = self.spool.cursor(self.name)
                await self._sleep(self.backoff_cap_s)

    def _count_exception(self, exc: Exception, during: str) -> None:
        self._errors.failed(f"sink:{self.name}", exc, "sink %s raised during %s; treating it "
                            "as a failed delivery", self.name, during)

    async def _step(self) -> SinkResult | None:
        if self._finishing:
            self._stopping.set()
            return await self._flush(final=True)
        if self._flush_due():
            result = await self._flush(final=False)
            if not result.ok:
                return result
        records = self.screen.screen(self.spool.read(self._position,
                                                     max_bytes=self.read_max_bytes))
        if not records:
            if self._draining:
                result = await self._flush(final=True)
                if result.ok:
                    self._stopping.set()
                return result
            await self._wait_for_records()
            return None
        result = await self._attempt(self.sink.write(records))
        if result.ok:
            self._position = records[-1].offset + 1
            self._accept(result)
        return result

    def _flush_due(self) -> bool:
        return time.monotonic() - self._last_flush >= self.flush_interval_s

    async def _flush(self, *, final: bool) -> SinkResult:
        self._last_flush = time.monotonic()
        result = await self._attempt(self.sink.flush(final=final))
        if result.ok:
            self._accept(result)
        return result

    async def _attempt(self, attempt: Awaitable[SinkResult]) -> SinkResult:
        """One call into the sink, its start exported while it runs: a store that hangs
        holds it until the sink's own timeouts end it, and reads as `ok` meanwhile."""
        self.progress.attempt_started()
        try:
            return await attempt
        finally:
            self.progress.attempt_ended()

    async def _wait_for_records(self) -> None:
        wait = asyncio.ensure_future(self.spool.wait_for(self._position, self.flush_interval_s))
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wait.cancel()
            stop.cancel()

    def _accept(self, result: SinkResult) -> None:
        if result.durable_through is not None:
            self.spool.commit(self.name, result.durable_through + 1)
            self.metrics.delivered_events.inc(result.delivered_events, sink=self.name)
            self.progress.delivered(result.delivered_events)
            self.state.last_success_ns = time.time_ns()
        elif not result.peer_ok:
            return  # buffered, not delivered: says nothing about the peer's health
        if self.state.failures_in_a_row and self._flaps.say_recovery(time.monotonic()):
            down_s = (time.time_ns() - self.state.failing_since_ns) / 1e9 \
                if self.state.failing_since_ns else 0.0
            log.info("sink %s recovered after %d failed attempts over %.0fs; %s events to "
                     "catch up", self.name, self.state.failures_in_a_row, down_s,
                     f"{self.spool.lag(self.name)[1]:,}")
        self.state.failures_in_a_row = 0
        self.metrics.sink_permanent_error.set(0, sink=self.name)
        if self.state.failing_since_ns:
            self._mark_delivering()

    async def _recover(self, result: SinkResult) -> None:
        state = self.state
        kind = result.error_kind or "error"
        self.metrics.delivery_errors.inc(sink=self.name, kind=kind)
        first_of_kind = state.failures_in_a_row == 0 or kind != state.last_error_kind
        state.failures_in_a_row += 1
        state.last_error_kind = kind
        self.metrics.sink_permanent_error.set(1 if result.permanent else 0, sink=self.name)
        if self._draining:
            self._say_down_while_draining(result)
        await self.sink.abandon()
        self._position = self.spool.cursor(self.name)
        if self._stopping.is_set():
            return  # stopped or replaced by a reload: no retry here
        if result.permanent:  # sooner where the sink watches what may fix it
            delay = min(PERMANENT_RETRY_S, result.retry_after_s or PERMANENT_RETRY_S)
        else:
            delay = backoff_delay(state.failures_in_a_row, cap=self.backoff_cap_s,
                                  retry_after=result.retry_after_s)
        self.metrics.retries.inc(sink=self.name)
        if self._draining:
            delay = min(delay, DRAIN_RETRY_S)  # the drain deadline is short: try more often
        self._mark_failing(kind, delay)
        now = time.monotonic()
        # once per change of kind (a sink that stays down does not flood), and flaps of an
        # endpoint that fails some requests once a minute at most (flaps.py)
        extra = self._flaps.say_failure(now, first_of_kind=first_of_kind,
                                        attempts=state.failures_in_a_row,
                                        permanent=result.permanent)
        if extra is not None:
            log.warning("sink %s failed (%s) delivering to %s: %s; next retry %s%s%s",
                        self.name, kind, self.sink.describe(), result.error,
                        f"in {delay:.1f}s" if delay >= 0.05 else "at once",
                        PERMANENT_HINT if result.permanent else "", extra)
            state.reminded_at = now
        elif now - state.reminded_at >= STILL_FAILING_EVERY_S:
            # and a line now and then while it stays down, so that a window of the log
            # (journalctl --since) does not read as healthy in the middle of an outage
            state.reminded_at = now
            lag = self.spool.lag(self.name)[1]
            log.warning("sink %s still failing (%s) since %s: %d attempts, %s events waiting; "
                        "last: %s", self.name, kind, utc_clock(state.failing_since_ns / 1e9),
                        state.failures_in_a_row, f"{lag:,}", result.error)
        await self._sleep(delay)

    def _mark_failing(self, kind: str, retry_in_s: float) -> None:
        """Export since when the sink fails, how, and when it tries again (evagg status)."""
        now_ns = time.time_ns()
        self.state.failing_since_ns = self.state.failing_since_ns or now_ns
        self.metrics.sink_failing_since.clear(sink=self.name)
        self.metrics.sink_failing_since.set(self.state.failing_since_ns / 1e9, sink=self.name,
                                            kind=kind)
        self.metrics.sink_next_retry.set(now_ns / 1e9 + retry_in_s, sink=self.name)

    def _mark_delivering(self) -> None:
        self.state.failing_since_ns = 0
        self.metrics.sink_failing_since.clear(sink=self.name)
        self.metrics.sink_next_retry.clear(sink=self.name)

    async def _sleep(self, seconds: float) -> None:
        """Wait out a backoff; drain() and stop() cut it short."""
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            pass
        self._wake.clear()

    def _say_down_while_draining(self, result: SinkResult) -> None:
        """Once per drain: where delivery fails, how long the drain still tries, and what
        stays spooled for the next start."""
        if self._said_down_while_draining:
            return
        self._said_down_while_draining = True
        left = (f"up to {max(self._drain_ends - time.monotonic(), 0.0):.0f}s more"
                if self._drain_ends is not None else "until the agent stops")
        log.warning("sink %s cannot deliver while draining: %s failed (%s); retrying for %s,"
                    " then its %d undelivered events stay spooled for the next start",
                    self.name, self.sink.describe(), result.error, left,
                    self.spool.lag(self.name)[1])

    def drain(self, deadline_s: float | None = None) -> None:
        """Deliver everything spooled so far, flush, then stop (the caller stops it at
        `deadline_s`, which the log names if the sink is down)."""
        self._draining = True
        if deadline_s is not None:
            self._drain_ends = time.monotonic() + deadline_s
        self._wake.set()

    def finish(self) -> None:
        """Stop for a reload without waiting for the backlog: what the sink has buffered
        is made durable once, then the consumer stops; a failing sink stops at once. The
        sink that replaces it starts from the cursor, so nothing is skipped or lost."""
        self._finishing = True
        if self.state.failing_since_ns:
            self._stopping.set()
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def close(self) -> None:
        await self.sink.close()
