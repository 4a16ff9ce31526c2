"""Sending one batch of the HTTP sink until the endpoint has it.

Each request takes a slot of the concurrency limit (`sinks.http.concurrency`) and its
answer goes back to it, and to the run of failed requests (`sinks.http.retries`). A
batch whose request failed in a way the endpoint may get over waits out its own backoff
and goes again alone, with the same key and body; a 4xx refusing the batch itself is
dead-lettered. What `send()` returns that is not None is the delivery loop's to handle,
and `Halt` tells every other batch to stop where it is.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections import Counter
from pathlib import Path
from ssl import SSLContext
from typing import Any, Final

import aiohttp

from emitters.ratelimit import RateLimitedLog
from sinks.base import SinkResult
from sinks.http.batches import Batch, Body, gzip_body
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
from sinks.http.halves import split_batch
from sinks.http.header_files import HeaderFiles
from sinks.http.options import HttpOptions
from sinks.http.recent import RecentRequests
from sinks.http.retries import BatchRetry, FailureStreak, retried_here

log = logging.getLogger("evagg.sinks.http")
MAX_POSTED_KEYS: Final = 100_000  # batches remembered as sent, for counting retries
# A 401 or 403 while the sink reads a header from a file: tried again this soon (one
# request each time), so a token written there after the refusal goes out within it.
HEADER_FILE_RETRY_S: Final = 10.0
TOO_LARGE: Final = "too_large"  # a 413 for a batch of several events: sent in halves
TOO_LARGE_FAILURE: Final = SinkResult.failure("HTTP 413", TOO_LARGE)
NOT_SENT: Final = SinkResult.failure("not sent: the sink stopped for the delivery loop",
                                     "skipped")


class Halt:
    """The sink stopping for the delivery loop: the failure it hands over, and a wake-up
    for the batches waiting out a backoff. A new one for each attempt of the loop."""

    def __init__(self) -> None:
        self.failure: SinkResult | None = None
        self._event = asyncio.Event()

    def stop(self, failure: SinkResult) -> None:
        if self.failure is None:
            self.failure = failure
        self._event.set()

    async def sleep(self, seconds: float) -> bool:
        """Wait `seconds`; False when the sink halted meanwhile."""
        try:
            async with asyncio.timeout(seconds):
                await self._event.wait()
        except TimeoutError:
            return True
        return False


class Sender:
    """The HTTP side of one sink: its connections, limit, failure streak and counts."""

    def __init__(self, name: str, url: str, options: HttpOptions, *, headers: dict[str, str],
                 proxy: dict[str, Any], ssl: SSLContext | None, dead_letter_dir: Path | None,
                 max_retry_backoff_s: float) -> None:
        self.name, self.url, self.options = name, url, options
        self.__headers = dict(headers)  # private: credentials, never in a log
        self.header_files = HeaderFiles(name, options.header_files)
        self._proxy, self._ssl = proxy, ssl
        self.dead_letter_dir = dead_letter_dir  # None: a permanent 4xx stops the sink instead
        self.max_retry_backoff_s = max_retry_backoff_s
        # kept across the loop's attempts: the endpoint is the same
        self.limit = ConcurrencyLimit(options.max_in_flight, fixed=options.concurrency)
        self.streak = FailureStreak()
        self.recent = RecentRequests()  # the last minutes' requests, for status and the log
        self.counters: Counter[str] = Counter()
        self.answered = False  # a request was answered 2xx since the sink last reported
        self._session: aiohttp.ClientSession | None = None
        self._refusals_log = RateLimitedLog(log)  # a log line a minute, not a flood
        # The keys of batches POSTed and not yet passed by the cursor: a request under one
        # of them is a retry ("a batch sent again with a key already used"), counted when
        # it goes out, not when the loop cuts the batch again and may not send it.
        self._posted: set[str] = set()
        # key of a batch refused as too large -> keys of its halves delivered (or
        # dead-lettered), not sent again when the loop resends the batch
        self._halves_delivered: dict[str, set[str]] = {}

    async def send(self, batch: Batch, halt: Halt) -> SinkResult | None:
        """Send `batch` until it is answered 2xx or dead-lettered (then None), retrying a
        passing failure after the batch's own backoff. A failure returned is the loop's:
        every request is failing, or it is no passing trouble of the endpoint."""
        fixed = {"Content-Type": CONTENT_TYPES[self.options.body_format],
                 "Idempotency-Key": batch.key, "User-Agent": "evagg"}
        retry = BatchRetry(self.max_retry_backoff_s)
        try:
            body = batch.body
            if self.options.gzip:  # before taking a slot: queued batches compress meanwhile
                body = await asyncio.to_thread(gzip_body, body, self.options.gzip_level)
                fixed["Content-Encoding"] = "gzip"
            while True:
                self.header_files.refresh(self.__headers)  # a rotated token goes out now
                headers = {**self.__headers, **fixed}
                result = await self._attempt(batch, body, headers, halt, retry.failures > 0)
                if result is None or halt.failure is not None:
                    return result
                if result.error_kind == "http_auth" and \
                        self.header_files.refresh(self.__headers):
                    continue  # the token file changed while the request was out
                if result.error_kind == TOO_LARGE:
                    return await self._send_halves(batch, halt)
                if not retried_here(result) or self.streak.down:
                    break
                if not await halt.sleep(retry.delay_after(result)):
                    return NOT_SENT
        except Exception as exc:  # a sink never raises into the loop
            log.exception("sink %s: unexpected error sending a batch", self.name)
            result = self._failed("internal_errors", SinkResult.failure(
                f"internal error: {type(exc).__name__}", "internal"))
        halt.stop(result)
        return result

    async def _send_halves(self, batch: Batch, halt: Halt) -> SinkResult | None:
        """A batch refused as too large (413), sent again as two halves, each split again
        while the endpoint refuses it, down to single events (dead-lettered if refused
        still). Halves already delivered are not sent again when the batch is."""
        halves = split_batch(batch, self.options.body_format)
        if not halves:
            return await self._dead_letter(batch, 413, "too large, and cannot be split")
        self.counters["split_batches"] += 1
        self._refusals_log.log(  # a line a minute: halving a batch may take many 413s
            logging.WARNING, "too_large", "sink %s: %s refused a batch of %d events (%d "
            "bytes) as too large (HTTP 413); sending it in halves (%d batches split so "
            "far; lower batch_max_bytes to avoid this)", self.name,
            url_for_display(self.url), batch.events, len(batch.body),
            self.counters["split_batches"])
        delivered = self._halves_delivered.setdefault(batch.key, set())
        for half in halves:
            if half.key in delivered:
                continue
            result = await self.send(half, halt)
            if result is not None:
                return result
            delivered.add(half.key)
            self._halves_delivered.pop(half.key, None)
        return None

    def passed(self, batch: Batch) -> None:
        """The cursor moved over the batch: it is never sent again."""
        self._posted.discard(batch.key)
        for half in self._halves_delivered.pop(batch.key, ()):
            self._posted.discard(half)

    def say_held_refusals(self, *, at_close: bool = False) -> None:
        """The dead-letter lines the once-a-minute limit held back, once their minute is
        over (or now, at close)."""
        self._refusals_log.say_held(force=at_close)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _attempt(self, batch: Batch, body: Body, headers: dict[str, str], halt: Halt,
                       resend: bool) -> SinkResult | None:
        """One request in one slot; the answer goes to the concurrency limit and the streak."""
        ticket = await self.limit.acquire(retry=resend)
        answer = Answer.NEUTRAL
        try:
            if halt.failure is not None:  # halted while waiting: the loop resends
                return NOT_SENT
            if batch.key in self._posted:
                self.counters["retries"] += 1
            elif len(self._posted) >= MAX_POSTED_KEYS:  # batches the spool dropped unsent
                self._posted.clear()
            self._posted.add(batch.key)
            result, answer = await self._request(batch, body, headers)
        finally:
            self.limit.release(ticket, answer)
        if result is None:
            self.streak.answered()
        elif retried_here(result):
            self.streak.failed()
        self._count_recent(result)
        return result

    def _count_recent(self, result: SinkResult | None) -> None:
        """The request in the window of recent ones; the log says once in a while that
        many fail, though the sink delivers (the delivery loop hears only of a run of
        failures in a row, which an endpoint failing two requests in three never makes)."""
        failed_kind = result.error_kind if result is not None and retried_here(result) \
            else None
        self.recent.ended(failed_kind)
        if failed_kind is None or (seen := self.recent.worth_saying()) is None:
            return
        log.warning("sink %s: %d of its %d requests to %s in the last %d minutes failed (%s) "
                    "and were retried one by one; the sink delivers, slower, and the spool "
                    "holds what waits. Look at the endpoint: its errors and load, or a bad "
                    "replica behind its balancer (evagg status shows the counts)", self.name,
                    seen.failed_total, seen.requests, url_for_display(self.url),
                    self.recent.window_s // 60, seen.kinds_text())

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
            failure = self._failed(*failure_for_error(exc, self.options.timeout_s))
            return failure, load_answer_for_error(failure)
        self.counters[f"requests_{min(status // 100, 5)}xx"] += 1
        self.counters["bytes_sent"] += len(body)
        if 200 <= status < 300:
            self.counters["events_sent"] += batch.events
            self.answered = True
            return None, load_answer(status)
        if status == 413 and batch.events > 1:  # the endpoint's limit, not these events
            return TOO_LARGE_FAILURE, load_answer(status)
        refused = failure_for_status(status, retry_after)
        if refused is not None and status in (401, 403):
            refused = self._auth_refused(status)
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
                body_format=self.options.body_format, sink=self.name,
                first_offset=batch.first[0], last_offset=batch.stop[0])
        except OSError as exc:
            return SinkResult.failure(f"HTTP {status} and the dead letter failed: {exc.strerror}",
                                      "dead_letter")
        self.counters["dead_lettered_batches"] += 1
        self.counters["dead_lettered_events"] += batch.events
        self._refusals_log.log(
            logging.WARNING, "refused", "sink %s: %s refused %d events with HTTP %d; kept in "
            "%s (%d batches dead-lettered so far); once the endpoint takes them: evagg dlq "
            "replay --sink %s", self.name, url_for_display(self.url), batch.events, status,
            letter.body_path, self.counters["dead_lettered_batches"], self.name)
        return None

    def _auth_refused(self, status: int) -> SinkResult:
        """A 401 or 403, saying what to do: header files are read again when they change;
        other credentials need the config fixed and a reload."""
        files = self.header_files.files
        if files:
            what = (f"write the new value to {', '.join(sorted(set(files.values())))}: "
                    "the sink reads it again before its next request, no reload needed")
        else:
            what = "fix them in the config, then reload (SIGHUP; an env: value needs a restart)"
        # with header files, the next request, which may carry a new token, comes soon
        return SinkResult.failure(f"HTTP {status}: check the credentials; {what}",
                                  "http_auth", permanent=True,
                                  retry_after_s=HEADER_FILE_RETRY_S if files else None)

    def _failed(self, counter: str, failure: SinkResult) -> SinkResult:
        self.counters[counter] += 1
        self.counters["requests_failed"] += 1
        return failure

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.options.timeout_s),
                connector=aiohttp.TCPConnector(limit=self.options.max_in_flight,
                                               ssl=True if self._ssl is None else self._ssl))
        return self._session
