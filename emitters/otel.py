"""OpenTelemetry for evagg producers: spans to the local agent, trace context across processes.

`init_telemetry("trainer")` installs an OTel SDK TracerProvider whose spans go to the agent
as `span` events over the Unix socket (exporter "evagg": no OTLP encoding in the worker) or
over OTLP/HTTP to its /v1/traces ("otlp"), with ids from os.urandom. OpenTelemetry is
imported lazily; without it `get_tracer` is a no-op and propagation uses
`emitters.tracecontext`. `span_event` maps a span to a row for both paths, so the socket
exporter and the agent's OTLP decoder store identical rows.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

import emitters
from emitters.emitter import Emitter

log = logging.getLogger("evagg.otel")

RUN_ID_KEYS = ("evagg.run_id", "run_id")
JOB_ID_KEYS = ("evagg.job_id", "job_id", "ray.job_id")
STEP_KEYS = ("evagg.step", "step")
EXCEPTION_EVENT = "exception"
_SPECIAL_KEYS = frozenset((*RUN_ID_KEYS, *JOB_ID_KEYS, *STEP_KEYS, "error.type"))
_NOTHING: Mapping[str, Any] = {}


def attr_text(value: Any) -> str:
    """An attribute value as the text evagg stores (both span paths use this rule)."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        return repr(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def resource_text(attributes: Mapping[str, Any]) -> dict[str, str]:
    """Resource attributes as attrs text, less the SDK's constant telemetry.sdk.* labels."""
    return {k: attr_text(v) for k, v in attributes.items()
            if v is not None and not k.startswith("telemetry.sdk.")}


def span_event_id(trace_id: str, span_id: str, start_ns: int) -> str:
    """A UUIDv7-shaped id fixed by the span, so a resent span dedupes on `event_id`.

    Its 74 random bits are the trace id's last 12 (random by W3C rule) and 62 of the span
    id's; a hash would cost twice as much per span.
    """
    h = f"{max(start_ns, 0) // 1_000_000:012x}"
    return f"{h[:8]}-{h[8:12]}-7{trace_id[-3:]}-{_VARIANT[span_id[0]]}{span_id[1:4]}-{span_id[4:]}"


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def span_event(
    *, name: str, trace_id: str, span_id: str, parent_span_id: str | None, start_ns: int,
    end_ns: int, failed: bool, status_message: str, span_kind: str, scope: str,
    attributes: Mapping[str, Any], resource: Mapping[str, str],
    exception: Mapping[str, Any] | None = None, links: Iterable[str] = (),
) -> dict[str, Any]:
    """One evagg `span` event row from plain span fields (ids as lower-case hex; the
    resource already as text, see `resource_text`)."""
    attrs = dict(resource)
    for key, value in attributes.items():
        if value is not None:
            attrs[key] = value if type(value) is str else attr_text(value)
    if span_kind != "INTERNAL":  # the default; an export without it reads as INTERNAL
        attrs["otel.span_kind"] = span_kind
    if scope:
        attrs["otel.scope"] = scope
    link_list = list(links)
    if link_list:
        attrs["otel.links"] = attr_text(link_list)
    row: dict[str, Any] = {
        "event_id": span_event_id(trace_id, span_id, start_ns), "kind": "span",
        "source": "otel", "name": name, "state": "FAILED" if failed else "FINISHED",
        "trace_id": trace_id, "span_id": span_id, "attrs": attrs,
    }
    if start_ns > 0:
        row["time"] = start_ns
        if end_ns >= start_ns:
            row["duration_s"] = (end_ns - start_ns) / 1e9
    if parent_span_id:
        row["parent_span_id"] = parent_span_id
    # Most spans carry none of the special keys: look them up only when some are there.
    special = attributes if not _SPECIAL_KEYS.isdisjoint(attributes) else _NOTHING
    for column, keys in (("run_id", RUN_ID_KEYS), ("job_id", JOB_ID_KEYS)):
        value = _first(keys, special, resource)
        if value is not None:
            row[column] = attr_text(value)
    step = _first(STEP_KEYS, special)
    if type(step) is int:
        row["step"] = step
    if failed or exception:
        _add_error(row, failed, status_message, special, exception or {})
    return row


def _first(keys: tuple[str, ...], *sources: Mapping[str, Any]) -> Any:
    for source in sources:
        for key in keys:
            value = source.get(key)
            if value is not None and value != "":
                return value
    return None


def _add_error(row: dict[str, Any], failed: bool, status_message: str,
               attributes: Mapping[str, Any], exc: Mapping[str, Any]) -> None:
    fields = {
        "error_type": exc.get("exception.type") or attributes.get("error.type"),
        "error_message": status_message if failed and status_message
        else exc.get("exception.message"),
        "stack_trace": exc.get("exception.stacktrace"),
    }
    row.update((k, attr_text(v)) for k, v in fields.items() if v)


def readable_span_event(span: Any, resource: Mapping[str, str]) -> dict[str, Any]:
    """The event row of a finished OTel SDK ReadableSpan."""
    # The public properties copy (events, links) or wrap (attributes) on every access;
    # read the fields they wrap where present: a third of the cost per span.
    events = getattr(span, "_events", None)
    links = getattr(span, "_links", None)
    attributes = getattr(span, "_attributes", _MISSING)
    exception = None
    for event in span.events if events is None else events:
        if event.name == EXCEPTION_EVENT:
            exception = event.attributes
    parent = span.parent
    scope = span.instrumentation_scope
    start = span.start_time or 0
    context = span.context
    return span_event(
        name=span.name,
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
        start_ns=start,
        end_ns=span.end_time or start,
        failed=span.status.status_code.value == _STATUS_ERROR,
        status_message=span.status.description or "",
        span_kind=span.kind.name,
        scope=scope.name if scope is not None else "",
        attributes=dict(span.attributes if attributes is _MISSING else attributes or {}),
        resource=resource,
        exception=exception,
        links=[f"{link.context.trace_id:032x}-{link.context.span_id:016x}"
               for link in (span.links if links is None else links)],
    )


_MISSING: Any = object()
_STATUS_ERROR = 2  # opentelemetry.trace.StatusCode.ERROR


class EvaggSpanExporter:
    """An OTel SpanExporter that hands finished spans to the evagg emitter.

    The emitter's background thread frames and sends them over the Unix socket, so the
    worker never encodes OTLP. It never raises: failures are counted in `errors`.
    """

    def __init__(self, emitter: Emitter | None = None) -> None:
        self.emitter = emitter or emitters.get_emitter()
        self.errors: Counter[str] = Counter()
        self._resources: dict[int, tuple[Any, dict[str, str]]] = {}

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        emit = self.emitter.emit
        for span in spans:
            try:
                emit(**readable_span_event(span, self._resource_attrs(span.resource)))
            except Exception as exc:
                self._count(exc)
        return SpanExportResult.SUCCESS

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
    if exporter == "evagg":
        return EvaggSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint or default_otlp_endpoint())


def default_otlp_endpoint() -> str:
    """The local agent's OTLP route, from EVAGG_HTTP_LISTEN (default 127.0.0.1:4040)."""
    host, _, port = os.environ.get("EVAGG_HTTP_LISTEN", "127.0.0.1:4040").rpartition(":")
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
    if _provider is not None:
        return True
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    return bool(trace.get_current_span().get_span_context().is_valid)


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
    if not _otel_active():
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
