"""OpenTelemetry for evagg producers: spans to the local agent, trace context across processes.

`init_telemetry("trainer")` installs an OTel SDK TracerProvider whose spans go to the agent
as `span` events over the Unix socket (exporter "evagg": no OTLP encoding in the worker) or
over OTLP/HTTP to its /v1/traces ("otlp"), with ids from os.urandom. OpenTelemetry is
imported lazily; without it `get_tracer` is a no-op and propagation uses
`emitters.tracecontext`. `span_event` (`otel_rows.py`, beside this module) maps a span to
a row for both paths, so the socket exporter and the agent's OTLP decoder store identical
rows; `otel_fast.py` makes the same rows faster for the exporter's common spans.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

import emitters
from emitters.emitter import Emitter
from emitters.integrations.otel_fast import SpanRows
from emitters.integrations.otel_rows import (
    CUT_KEY,
    EXCEPTION_EVENT,
    VALUE_LIMIT,
    UnendedSpan,
    readable_span_event,
    resource_text,
    span_event,
)

log = logging.getLogger("evagg.otel")


class EvaggSpanExporter:
    """An OTel SpanExporter that hands finished spans to the evagg emitter.

    The emitter's background thread frames and sends them over the Unix socket, so the
    worker never encodes OTLP. SDK spans become finished rows in one pass (otel_fast) and
    enter the emitter's queue past its per-field checks; any other span takes the generic
    path through emit(). It never raises: failures are counted in `errors`, spans refused
    for having no usable end time in `refused["unended"]`, attribute values cut to
    VALUE_LIMIT characters in `cut_attributes` (the span is kept).
    """

    def __init__(self, emitter: Emitter | None = None) -> None:
        self.emitter = emitter or emitters.get_emitter()
        self.errors: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.cut_attributes = 0
        self._resources: dict[int, tuple[Any, dict[str, str]]] = {}
        self._rows: SpanRows | None = None
        self._fast = True  # until the fast path fails once: then every span goes generic

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        others: Sequence[Any] = spans
        if self._fast:
            try:
                if self._rows is None:
                    self._rows = SpanRows()
                rows, others = self._rows.convert(spans)
                self._count_cuts(rows)
                self.emitter.enqueue_built(rows)
            except Exception as exc:  # an SDK or emitter without what the fast path reads
                self._count(exc)
                self._fast = False
                others = spans
        emit = self.emitter.emit
        for span in others:
            try:
                row = readable_span_event(span, self._resource_attrs(span.resource))
                self._count_cuts((row,))
                emit(**row)
            except UnendedSpan as exc:
                self._refuse("unended", exc)
            except Exception as exc:
                self._count(exc)
        return SpanExportResult.SUCCESS

    def _count_cuts(self, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            cut = row.get("attrs", _NO_ATTRS).get(CUT_KEY)
            if cut is not None:
                if not self.cut_attributes:
                    log.warning("span attribute values longer than %d characters are cut "
                                "to that length, the span kept; attrs['%s'] names them "
                                "(counted from now on)", VALUE_LIMIT, CUT_KEY)
                self.cut_attributes += len(orjson.loads(cut))

    def _refuse(self, reason: str, exc: Exception) -> None:
        if not self.refused[reason]:
            log.warning("evagg span export refused a span: %s (counted from now on)", exc)
        self.refused[reason] += 1

    def _resource_attrs(self, resource: Any) -> dict[str, str]:
        # One provider has one Resource: convert its attributes once, not per span.
        cached = self._resources.get(id(resource))
        if cached is None or cached[0] is not resource:
            cached = (resource, resource_text(resource.attributes))
            self._resources[id(resource)] = cached
        return cached[1]

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        try:
            return self.emitter.flush(timeout_millis / 1000)
        except Exception as exc:
            self._count(exc)
            return False

    def shutdown(self) -> None:
        """Nothing to release; `shutdown_telemetry` flushes the emitter with its deadline."""

    def _count(self, exc: Exception) -> None:
        reason = type(exc).__name__
        if not self.errors[reason]:
            log.warning("evagg span export failed: %r (counted from now on)", exc)
        self.errors[reason] += 1


def urandom_id_generator() -> Any:
    """An OTel IdGenerator drawing from os.urandom (the SDK's default uses `random`)."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class UrandomIdGenerator(IdGenerator):
        def generate_span_id(self) -> int:
            return _nonzero_random(8)

        def generate_trace_id(self) -> int:
            return _nonzero_random(16)

    return UrandomIdGenerator()


def _nonzero_random(size: int) -> int:
    while True:
        value = int.from_bytes(os.urandom(size), "big")
        if value:
            return value

__all__ = [
    "EXCEPTION_EVENT", "EvaggSpanExporter", "attach_trace_context", "default_otlp_endpoint",
    "get_tracer", "init_telemetry", "inject_trace_context", "readable_span_event",
    "resource_text", "shutdown_telemetry", "span_event", "urandom_id_generator",
]

_NO_ATTRS: dict[str, str] = {}
_provider: Any = None
_exporter: EvaggSpanExporter | None = None
_TRACEPARENT_KEYS = ("traceparent", "tracestate")


def init_telemetry(
    service_name: str,
    *,
    exporter: str = "evagg",
    endpoint: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> Any:
    """Install this process's TracerProvider; returns it, or None when telemetry is off.

    exporter: "evagg" (Unix socket), "otlp" (OTLP/HTTP protobuf to the agent's /v1/traces,
    or `endpoint`) or "none". Without OpenTelemetry it logs a warning and stays off.
    """
    global _provider, _exporter
    if exporter not in ("evagg", "otlp", "none"):
        raise ValueError(f"exporter must be 'evagg', 'otlp' or 'none', not {exporter!r}")
    shutdown_telemetry()
    if exporter == "none":
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OpenTelemetry SDK is not installed: telemetry is off")
        return None
    resource = Resource.create({**_context_attributes(service_name), **(attributes or {})})
    provider = TracerProvider(resource=resource, id_generator=urandom_id_generator())
    span_exporter = _span_exporter(exporter, endpoint)
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # so instrumented libraries use it too
    _provider = provider
    _exporter = span_exporter if isinstance(span_exporter, EvaggSpanExporter) else None
    return provider


def _context_attributes(service_name: str) -> dict[str, str]:
    out = {"service.name": service_name}
    for env, key in (("EVAGG_RUN_ID", "evagg.run_id"), ("EVAGG_JOB_ID", "evagg.job_id")):
        if os.environ.get(env):
            out[key] = os.environ[env]
    return out


def _span_exporter(exporter: str, endpoint: str | None) -> Any:
    if exporter == "otlp" and endpoint is None and os.environ.get("EVAGG_AGENT_HTTP") == "":
        # An agent on demand without HTTP (emitters/agent_http.py): whoever holds its
        # would-be port is not it, so the spans take its socket instead.
        log.warning("evagg: the agent runs without HTTP; spans go to it over its socket")
        exporter = "evagg"
    if exporter == "evagg":
        return EvaggSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint or default_otlp_endpoint())


def default_otlp_endpoint() -> str:
    """The local agent's OTLP route: where an agent on demand answers (EVAGG_AGENT_HTTP, set
    by the driver that asked for it), else EVAGG_HTTP_LISTEN, else 127.0.0.1:4040."""
    listen = os.environ.get("EVAGG_AGENT_HTTP") or os.environ.get("EVAGG_HTTP_LISTEN",
                                                                   "127.0.0.1:4040")
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}/v1/traces"


def get_tracer(name: str) -> Any:
    """A tracer from the evagg provider; a no-op tracer when telemetry is off."""
    if _provider is not None:
        return _provider.get_tracer(name)
    try:
        from opentelemetry.trace import NoOpTracer
    except ImportError:
        return _NoOpTracer()
    return NoOpTracer()


def shutdown_telemetry(timeout_s: float = 5.0) -> bool:
    """End telemetry: export open batches and wait up to `timeout_s` for the agent's acks.

    Returns False when that deadline passed (spans stay with the emitter, which keeps
    trying until the process exits). Safe to call twice.
    """
    global _provider, _exporter
    provider, exporter, _provider, _exporter = _provider, _exporter, None, None
    if provider is None:
        return True
    try:
        provider.force_flush(int(timeout_s * 1000))
        provider.shutdown()
    except Exception as exc:
        log.warning("telemetry shutdown failed: %r", exc)
        return False
    return exporter.force_flush(int(timeout_s * 1000)) if exporter is not None else True


def _otel_active() -> bool:
    """Whether OpenTelemetry carries the current context: our provider or a span current."""
    if _provider is not None:
        return True
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    return bool(trace.get_current_span().get_span_context().is_valid)


def _otel_receives() -> bool:
    """Whether an attached context must go to OpenTelemetry: as `_otel_active`, or a
    provider of the user's own is installed (an actor that builds its own, with our
    exporter: a context attached only to evagg's would miss its spans)."""
    if _otel_active():
        return True
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    return type(trace.get_tracer_provider()).__name__ not in ("ProxyTracerProvider",
                                                               "NoOpTracerProvider")


def inject_trace_context(meta: dict[str, str]) -> dict[str, str]:
    """Write the current trace context into `meta` ("traceparent", "tracestate")."""
    if not _otel_active():
        from emitters import tracecontext

        return tracecontext.inject_trace_context(meta)
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(meta)
    return meta


def attach_trace_context(meta: Mapping[str, str]) -> Any:
    """Make the context in `meta` current; spans started next are its children."""
    if not _otel_receives():
        from emitters import tracecontext

        return tracecontext.attach_trace_context(meta)
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {k: meta[k] for k in _TRACEPARENT_KEYS if k in meta}
    return _Attached(context.attach(TraceContextTextMapPropagator().extract(carrier)))


class _Attached:
    """What `attach_trace_context` returns on the OTel path: `with` it, or call detach()."""

    def __init__(self, token: Any) -> None:
        self._token = token

    def detach(self) -> None:
        from opentelemetry import context

        if self._token is not None:
            context.detach(self._token)
            self._token = None

    def __enter__(self) -> _Attached:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


class _NoOpTracer:
    """Stands in for OTel's NoOpTracer (and its spans) when OpenTelemetry is not installed."""

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> _NoOpTracer:
        return self

    start_span = start_as_current_span

    def __enter__(self) -> _NoOpTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None  # set_attribute, record_exception, end, ...
