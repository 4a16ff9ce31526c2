"""The loopback HTTP port: ingest routes for producers that can't use the socket,
Ray's Event Export and OTLP, plus /metrics, /healthz, /readyz and a live tail.

Each ingest route answers only after the batch is in the spool, and a body that cannot
be read at all gets a 400 with the reason and nothing of it is spooled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from collections.abc import Awaitable, Callable

import pyarrow as pa
from aiohttp import web

from aggregator.decode import otlp
from aggregator.decode.normalize import Normalized, Stamp
from aggregator.ingest.bodies import BodyRefused, encoding_name, inflate
from aggregator.ingest.http_answers import (
    NO_SIGNAL_PATH,
    NOT_TAKEN,
    OTLP_PATHS,
    STATE_API_ELSEWHERE,
    error_answer,
    ingest_answer,
    no_signal_path_reason,
    refusal,
)
from aggregator.ingest.ingestor import Ingestor, IngestResult, SpoolUnavailable
from aggregator.ingest.tail import stream_tail
from aggregator.metrics import AgentMetrics
from aggregator.ray.batch import RayBatch
from aggregator.ray.events import RayBodyError
from aggregator.ray.intake import RayIntake, RayResendPending
from sinks.listener import from_another_site
from sinks.locations import host_header_trusted

log = logging.getLogger("evagg.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INGEST_PATHS = frozenset({"/v1/events", "/ray/events", "/v1/traces"})
KNOWN_PATHS = INGEST_PATHS | OTLP_PATHS | {"/metrics", "/healthz", "/readyz", "/v1/tail"}
READABLE_ENCODINGS = frozenset({"identity", "gzip", "deflate"})  # bodies.py inflates these
# How long a request waits for room in a full spool (when_full = "block") before its 503:
# an HTTP sender times out and resends anyway, and a request held open forever holds its
# connection and its sender's thread.
ROOM_WAIT_S = 5.0
RETRY_LATER = {"Retry-After": "5"}  # on a 503 while the agent drains


class HttpApi:
    def __init__(self, ingestor: Ingestor, metrics: AgentMetrics, *, max_body_bytes: int,
                 token: str | None, is_ready: Callable[[], bool],
                 listen_host: str = "127.0.0.1", stall_s: float = 10.0) -> None:
        self.ingestor = ingestor
        self.listen_host = listen_host
        # a body that sends no byte for this long is cut off (frame_timeout, as a frame)
        self.stall_s = stall_s
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.token = token
        self.is_ready = is_ready
        self.ray: RayIntake[IngestResult] = RayIntake(ingestor.in_thread, self._store_ray)
        # Who sees each spooled batch of Ray rows (the Ray log follower); must not block.
        self.ray_rows_observers: list[Callable[[pa.RecordBatch], None]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes,
                              middlewares=[self._guard])
        app.router.add_post("/v1/events", self.post_events)
        app.router.add_post("/ray/events", self.post_ray_events)
        app.router.add_post("/v1/traces", self.post_traces)
        for path in NOT_TAKEN:
            app.router.add_post(path, self.post_not_taken)
        app.router.add_post(NO_SIGNAL_PATH, self.post_no_signal_path)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/healthz", self.get_healthz)
        app.router.add_get("/readyz", self.get_readyz)
        app.router.add_get("/v1/tail", self.get_tail)
        app.router.add_get("/api/{rest:.*}", self.get_state_api_elsewhere)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """No browser; bearer token on ingest routes; every failure becomes a short
        readable answer."""
        refused = self._from_a_browser(request)
        if refused:
            # a known route's path, else one word: a label must not take a page's words
            route = request.path if request.path in KNOWN_PATHS else "other"
            self.metrics.bad_input.inc(route=route, reason="browser_request")
            return refusal(request, 403, refused)
        guarded = request.path in INGEST_PATHS or request.path == "/v1/tail"
        if self.token and guarded and not self._authorized(request):
            self.metrics.bad_input.inc(route=request.path, reason="unauthorized")
            return refusal(request, 401, "missing or wrong bearer token")
        if request.path in INGEST_PATHS and not self.is_ready():
            return refusal(request, 503, "the agent is draining", headers=RETRY_LATER)
        try:
            return await handler(request)
        except web.RequestPayloadError as exc:  # e.g. a body cut off on the way
            self.metrics.bad_input.inc(route=request.path, reason="bad_encoding")
            return refusal(request, 400, f"cannot read the body: {exc}")
        except BodyRefused as exc:
            self.metrics.bad_input.inc(route=request.path, reason=exc.reason)
            answer = refusal(request, exc.status, str(exc))
            if exc.status == 408:  # the rest of the body may never come: no next request
                answer.force_close()
            return answer
        except web.HTTPException as exc:
            if exc.status == 413:
                self.metrics.bad_input.inc(route=request.path, reason="too_large")
                return refusal(request, 413, f"body larger than {self.max_body_bytes} bytes")
            raise
        except asyncio.CancelledError:
            raise
        except SpoolUnavailable as exc:
            return refusal(request, 503, str(exc),
                            headers={"Retry-After": str(exc.retry_after_s)})
        except Exception as exc:
            self.metrics.worker_errors.inc(worker="http", type=type(exc).__name__)
            log.exception("request to %s failed", request.path)
            return error_answer(500, f"internal error: {type(exc).__name__}")

    def _from_a_browser(self, request: web.Request) -> str:
        """Why a request comes from a web page, or "". The port serves no page, and its
        clients (emitters, Ray, OTLP exporters) send no Origin; a browser sends one with
        every cross-site POST, which a page can make without asking (a text/plain form
        body), so any Origin is refused. A Host that names no loopback name, on a
        loopback port, is a page whose name was re-pointed at 127.0.0.1 (DNS rebinding),
        which could read /v1/tail and /metrics as its own."""
        if "Origin" in request.headers:
            return "requests from web pages are refused (the request has an Origin header)"
        site = from_another_site(request.headers)
        if site:  # a GET from a page, which sends no Origin: an <img src> on /v1/tail
            return f"requests from web pages are refused (Sec-Fetch-Site: {site})"
        if not host_header_trusted(request.headers.get("Host"), self.listen_host):
            return (f"Host {request.headers['Host'][:100]!r} does not name this machine; "
                    f"use http://127.0.0.1:<port> or http://localhost:<port>")
        return ""

    def _authorized(self, request: web.Request) -> bool:
        """A bearer token, or for Ray's exporter (which cannot send headers) ?token=."""
        assert self.token is not None
        offered = request.headers.get("Authorization", "")
        if hmac.compare_digest(offered.encode(), f"Bearer {self.token}".encode()):
            return True
        if request.path == "/ray/events":
            return hmac.compare_digest(request.query.get("token", "").encode(),
                                       self.token.encode())
        return False

    async def _read(self, request: web.Request) -> bytes:
        """The body, inflated here: the server's own decompression is off (bodies.py)."""
        encoding = encoding_name(request.headers.get("Content-Encoding"))
        if encoding not in READABLE_ENCODINGS:
            raise BodyRefused(f"Content-Encoding {encoding[:40]!r} is not supported "
                              "(gzip, deflate or none)", 415, "bad_encoding")
        body = await self._body(request)
        if encoding == "identity":
            return body
        return await self.ingestor.in_thread(inflate, body, encoding, self.max_body_bytes)

    async def _body(self, request: web.Request) -> bytes:
        """The raw body, held to http_max_body; a client that sends no byte of it for
        `stall_s` is refused (408), as a frame stalled on the socket is: it would hold
        its connection and the bytes it sent so far for as long as it likes."""
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                async with asyncio.timeout(self.stall_s):
                    chunk = await request.content.readany()
            except TimeoutError:
                raise BodyRefused(f"the body stalled: no byte for {self.stall_s:g} s",
                                  408, "stalled") from None
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes,
                                                    actual_size=size)
            chunks.append(chunk)

    async def post_events(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        if not body.strip():
            return self._bad(request, "empty_body", "the body is empty")
        result = await self.ingestor.ingest_ndjson(body, self.ingestor.stamp(), route="http",
                                                   room_wait_s=ROOM_WAIT_S)
        return ingest_answer(result)

    async def post_ray_events(self, request: web.Request) -> web.Response:
        """Ray's Event Export: each event stored once (aggregator/ray/intake.py); a resend
        that meets events another request failed to store gets a 503, so Ray sends again."""
        body = await self._read(request)
        # node_id holds Ray's own node ids on Ray's rows: a row Ray sent without one (the
        # executor's RUNNING event before Ray 2.56) stays empty rather than taking the
        # agent's node name, which the tasks view would then prefer over the hex id.
        stamp = dataclasses.replace(self.ingestor.stamp(), node_id="")
        try:
            result, mapped = await self.ray.accept(body, stamp)
        except RayBodyError as exc:
            return self._bad(request, "malformed", str(exc))
        except RayResendPending as exc:
            raise SpoolUnavailable(str(exc)) from None
        self._count_ray_paths(mapped)
        if mapped.normalized.accepted:
            for observe in self.ray_rows_observers:
                observe(mapped.normalized.batch)
        duplicates = mapped.duplicates + mapped.held
        self.metrics.duplicate_frames.inc(duplicates, route="ray")
        return ingest_answer(result, all_rejected_status=200, duplicates=duplicates)

    async def _store_ray(self, normalized: Normalized, stamp: Stamp) -> IngestResult:
        return await self.ingestor.store(normalized, stamp, route="ray", room_wait_s=ROOM_WAIT_S)

    def _count_ray_paths(self, mapped: RayBatch) -> None:
        if mapped.declined:
            self.metrics.ray_careful_events.inc(mapped.declined, reason="declined")
        if mapped.careful > mapped.declined:
            self.metrics.ray_careful_events.inc(mapped.careful - mapped.declined,
                                                reason="other_event_type")
        if mapped.times_one_by_one:
            self.metrics.ray_time_remaps.inc()

    async def post_traces(self, request: web.Request) -> web.Response:
        content_type = request.headers.get("Content-Type", "")
        # gzip (OTLP/HTTP's own) and deflate (which collectors take too) are inflated
        # here, held to http_max_body; any other encoding is a 415 saying what to send
        body = await self._read(request)
        try:
            decoded = await self.ingestor.in_thread(otlp.decode_otlp_traces, body, content_type)
        except otlp.OtlpError as exc:
            return self._bad(request, "malformed", str(exc), status=exc.status)
        # Spans refused by the decoder (bad ids, no end) count as rejected events too.
        result = await self.ingestor.ingest_rows(decoded.rows, self.ingestor.stamp(),
                                                 route="otlp", extra_rejected=decoded.rejected,
                                                 room_wait_s=ROOM_WAIT_S)
        if result.too_large:  # one span larger than a spool record: nothing was stored
            return refusal(request, 413, result.note)
        if decoded.cut_attributes and result.accepted:
            self.metrics.cut_values.inc(decoded.cut_attributes, route="otlp")
        # every refused span's reason (up to ten), as the socket's ack gives them
        note = "; ".join(result.reasons) or result.note
        answer, answer_type = otlp.otlp_response(content_type, result.rejected, note)
        return web.Response(body=answer, content_type=answer_type)

    async def post_not_taken(self, request: web.Request) -> web.Response:
        """OTLP metrics or logs: a 404 (not retryable) that says where they belong."""
        signal, variable = NOT_TAKEN[request.path]
        return self._bad(request, "signal_not_taken",
                         f"this agent takes OTLP traces only (POST /v1/traces), not {signal}: "
                         f"send {signal} to an OpenTelemetry Collector, or turn that "
                         f"exporter off ({variable}=none)", status=404)

    async def post_no_signal_path(self, request: web.Request) -> web.Response:
        """An exporter whose endpoint lacks /v1/traces: a 404 naming the one it meant."""
        return self._bad(request, "no_signal_path", no_signal_path_reason(request.host),
                         status=404)

    async def get_state_api_elsewhere(self, request: web.Request) -> web.Response:
        """Ray's tools (`ray list tasks --address`) pointed at this port: a 404 in Ray's
        envelope, whose `msg` Ray's client prints, saying where the State API is."""
        return web.json_response({"result": False, "msg": STATE_API_ELSEWHERE,
                                  "data": {"result": None}}, status=404)

    def _bad(self, request: web.Request, reason: str, text: str,
             status: int = 400) -> web.Response:
        self.metrics.bad_input.inc(route=request.path, reason=reason)
        return refusal(request, status, text)

    async def get_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.registry.render(),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def get_healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def get_readyz(self, request: web.Request) -> web.Response:
        if not self.is_ready():
            return web.Response(status=503, text="draining\n")
        if self.ingestor.spool.blocked:  # when_full = "block": new events wait for room
            return web.Response(status=503, text="spool full: new events wait for room\n")
        if (failure := self.ingestor.spool.write_failure) is not None:  # a full disk
            return web.Response(status=503, text=failure.says() + "\n")
        return web.Response(text="ready\n")

    async def get_tail(self, request: web.Request) -> web.StreamResponse:
        kinds = request.query.getall("kind", [])
        names = request.query.getall("name", [])
        return await stream_tail(request, self.ingestor.spool, kinds=kinds, names=names,
                                 is_ready=self.is_ready)
