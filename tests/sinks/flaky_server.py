"""A real aiohttp endpoint on 127.0.0.1 whose answers a test switches during a run.

It answers 200 by default; `answer()` scripts other statuses (with Retry-After),
`rotate()` cycles through a list of replies, `answer_for()` gives one reply to every
request for a while (an outage), `reset_after_store()` stores a body and then drops the
connection before answering (the answer is lost), `stall()` delays answers past a
client's timeout, and `stop()`/`start()` close and reopen the port so that connections
are refused. It decodes each body (aiohttp undoes the gzip; NDJSON or a JSON array) and
keeps what it saw: every request (when it arrived and was answered, how many were in
flight), batches by Idempotency-Key, and the distinct event ids of stored batches (2xx,
or reset after the store). With an `ssl_context` it serves https://.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.ports import free_port


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it, and what it answered."""

    key: str
    status: int
    content_type: str
    content_encoding: str
    headers: dict[str, str]
    body: bytes  # decoded (gunzipped)
    wire_bytes: int  # Content-Length as sent
    events: list[dict[str, Any]]
    arrived: float = 0.0  # time.monotonic() when the request came in
    answered: float = 0.0  # ...and when it was answered (or its connection dropped)
    in_flight: int = 0  # requests in the server at its arrival, itself included
    # time.time() at arrival and answer: what an HTTP date (Retry-After) is compared with
    arrived_at: float = 0.0
    answered_at: float = 0.0
    retry_after: str = ""  # the Retry-After header answered, if any

    @property
    def stored(self) -> bool:
        """The server kept the body: answered 2xx, or dropped after storing it."""
        return 200 <= self.status < 300 or self.status == RESET


RESET = 0  # the status recorded for a request whose connection was dropped after the store


@dataclass
class Reply:
    """One scripted reply: a status (RESET drops the connection after storing the body)."""

    status: int
    # a Retry-After header; a callable makes it as the answer leaves (an HTTP date that
    # must lie ahead of that moment, however long the client took to send)
    retry_after: str | Callable[[], str] | None = None
    text: str = ""
    delay_s: float = 0.0
    hold: asyncio.Event | None = None  # answer only once the test sets it


# One request in three fails, in rotation: a 500 or a 429 asking for a second; now and
# then a 200 takes two seconds (well within the timeout).
ONE_IN_THREE = [Reply(200), Reply(200), Reply(500), Reply(200), Reply(200, delay_s=2.0),
                Reply(429, retry_after="1"), Reply(200), Reply(200), Reply(500), Reply(200),
                Reply(200), Reply(429, retry_after="1")]


@dataclass
class FlakyServer:
    path: str = "/ingest"
    requests: list[Seen] = field(default_factory=list)
    event_ids: set[str] = field(default_factory=set)  # distinct ids of accepted events
    accepted_events: int = 0  # events in 2xx-answered requests, duplicates included
    port: int = 0
    _script: deque[Reply] = field(default_factory=deque)
    _default: Reply = field(default_factory=lambda: Reply(200))
    _stall_s: float = 0.0
    _conditional: list[tuple[Callable[[list[dict[str, Any]]], bool], Reply]] = field(
        default_factory=list)
    _rotation: list[Reply] = field(default_factory=list)
    _turn: int = 0
    _outage: tuple[float, Reply] | None = None  # (until, reply)
    _runner: web.AppRunner | None = None
    ssl_context: ssl.SSLContext | None = None  # serve https:// with it
    in_flight: int = 0
    most_in_flight: int = 0
    held: int = 0  # requests whose answer now waits for its Reply.hold
    # set: a request without exactly this Authorization is answered 401, before any script
    authorization: str | None = None
    # set: a request whose body (unzipped) is larger is answered 413, before any script
    max_body: int | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}{self.path}"

    def batches(self) -> dict[str, list[Seen]]:
        """Requests grouped by Idempotency-Key, in arrival order."""
        grouped: dict[str, list[Seen]] = {}
        for seen in self.requests:
            grouped.setdefault(seen.key, []).append(seen)
        return grouped

    def answer(self, status: int, *, times: int | None = 1,
               retry_after: str | Callable[[], str] | None = None, text: str = "",
               delay_s: float = 0.0) -> None:
        """Answer the next `times` requests with `status` (every request when times is None),
        each after `delay_s` seconds."""
        answer = Reply(status, retry_after, text or f"status {status}", delay_s)
        if times is None:
            self._default = answer
            self._script.clear()
        else:
            self._script.extend([answer] * times)

    def answer_when(self, holds: Callable[[list[dict[str, Any]]], bool], status: int, *,
                    delay_s: float = 0.0, retry_after: str | None = None,
                    hold: asyncio.Event | None = None) -> None:
        """Answer the first request whose events make `holds` true with `status`, once
        (after `delay_s`, or once `hold` is set)."""
        self._conditional.append((holds, Reply(status, retry_after, f"status {status}",
                                               delay_s, hold)))

    def rotate(self, replies: list[Reply]) -> None:
        """Answer request n with replies[n % len(replies)] (scripted answers go first)."""
        self._rotation, self._turn = list(replies), 0

    def answer_for(self, seconds: float, status: int, *, retry_after: str | None = None
                   ) -> None:
        """Answer every request with `status` for `seconds` from now."""
        until = time.monotonic() + seconds
        self._outage = (until, Reply(status, retry_after, f"status {status}"))

    def reset_after_store(self, times: int = 1) -> None:
        """Store the next `times` bodies, then drop each connection without an answer."""
        self._script.extend([Reply(RESET)] * times)

    def stall(self, seconds: float) -> None:
        """Hold each answer this long (0 answers at once)."""
        self._stall_s = seconds

    async def start(self) -> FlakyServer:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post(self.path, self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        if not self.port:
            self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True,
                          ssl_context=self.ssl_context).start()
        return self

    async def stop(self) -> None:
        """Close the port: new connections are refused until start()."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        arrived, arrived_at = time.monotonic(), time.time()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        concurrent = self.in_flight
        try:
            return await self._answer(request, (arrived, arrived_at), concurrent)
        finally:
            self.in_flight -= 1

    def _next_reply(self, events: list[dict[str, Any]], now: float) -> Reply:
        for index, (holds, conditional) in enumerate(self._conditional):
            if holds(events):
                del self._conditional[index]
                return conditional
        if self._script:
            return self._script.popleft()
        if self._outage is not None and now < self._outage[0]:
            return self._outage[1]
        if self._rotation:
            self._turn += 1
            return self._rotation[(self._turn - 1) % len(self._rotation)]
        return self._default

    async def _answer(self, request: web.Request, arrival: tuple[float, float],
                      concurrent: int) -> web.Response:
        arrived, arrived_at = arrival  # time.monotonic(), time.time()
        body = await request.read()  # aiohttp has already undone Content-Encoding: gzip
        encoding = request.headers.get("Content-Encoding", "")
        wire_bytes = int(request.headers.get("Content-Length", "0"))
        events = _decode(body, request.content_type)
        if self.authorization is not None and \
                request.headers.get("Authorization") != self.authorization:
            answer = Reply(401, text="invalid token")
        elif self.max_body is not None and len(body) > self.max_body:
            answer = Reply(413, text="request entity too large")
        else:
            answer = self._next_reply(events, arrived)
        if self._stall_s or answer.delay_s:
            await asyncio.sleep(self._stall_s or answer.delay_s)
        if answer.hold is not None:
            self.held += 1
            try:
                await answer.hold.wait()
            finally:
                self.held -= 1
        retry_after = answer.retry_after() if callable(answer.retry_after) else answer.retry_after
        seen = Seen(request.headers.get("Idempotency-Key", ""), answer.status,
                    request.content_type, encoding, dict(request.headers), body, wire_bytes,
                    events, arrived, time.monotonic(), concurrent, arrived_at, time.time(),
                    retry_after or "")
        self.requests.append(seen)
        if seen.stored:
            self.accepted_events += len(events)
            self.event_ids.update(str(e.get("event_id")) for e in events)
        if answer.status == RESET:
            assert request.transport is not None
            request.transport.abort()  # the body is stored; the answer never leaves
            return web.Response(status=200)
        headers = {"Retry-After": retry_after} if retry_after else {}
        return web.Response(status=answer.status, text=answer.text, headers=headers)


def _decode(body: bytes, content_type: str) -> list[dict[str, Any]]:
    if content_type == "application/json":
        events = orjson.loads(body)
        assert isinstance(events, list), "a JSON body must be an array of events"
        return events
    assert content_type == "application/x-ndjson", content_type
    return [orjson.loads(line) for line in body.split(b"\n") if line.strip()]


