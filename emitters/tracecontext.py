"""W3C trace context without OpenTelemetry: the current span in a contextvar, and
`traceparent` carried across processes in a plain dict.

    meta = inject_trace_context({})              # caller: {"traceparent": "00-<trace>-<span>-01"}
    f.remote(x, meta)
    ...
    with attach_trace_context(meta):             # callee: the caller's span is the parent
        with span() as ctx: ...                  # ctx.trace_id, ctx.span_id, ctx.parent_span_id

The dict uses the header names OpenTelemetry's propagator uses ("traceparent",
"tracestate"), so meta written by `emitters.otel` reads here and the other way round.
Nesting follows the contextvar, so it is right per thread and per asyncio task. When no
context of ours is current but an OpenTelemetry span is (in a process that imported
OpenTelemetry), that span is the parent. Ids come from `emitters.ids` (os.urandom).
"""

from __future__ import annotations

import contextvars
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from emitters.ids import new_span_id, new_trace_id

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 lowercase hex digits, not all zero
    parent_span_id: str | None = None  # None for a root span or a context from elsewhere
    sampled: bool = True
    tracestate: str = ""

    def fields(self) -> dict[str, str]:
        """The event columns for this span: trace_id, span_id and parent_span_id if any."""
        out = {"trace_id": self.trace_id, "span_id": self.span_id}
        if self.parent_span_id:
            out["parent_span_id"] = self.parent_span_id
        return out


_CURRENT: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "evagg_trace_context", default=None)


def format_traceparent(context: TraceContext) -> str:
    return f"00-{context.trace_id}-{context.span_id}-{'01' if context.sampled else '00'}"


def parse_traceparent(value: Any, tracestate: Any = "") -> TraceContext | None:
    """A `traceparent` header value -> context, or None when it is not valid W3C."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT_RE.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or not trace_id.strip("0") \
            or not span_id.strip("0"):
        return None
    state = tracestate if isinstance(tracestate, str) else ""
    return TraceContext(trace_id, span_id, None, bool(int(flags, 16) & 1), state)


def current() -> TraceContext | None:
    """The innermost span: ours, else an active OpenTelemetry span, else None."""
    context = _CURRENT.get()
    return context if context is not None else _otel_current()


def _otel_current() -> TraceContext | None:
    trace = sys.modules.get("opentelemetry.trace")  # only if the process uses OTel already
    if trace is None:
        return None
    try:
        span_context = trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return None
        return TraceContext(f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}",
                            None, bool(span_context.trace_flags & 1))
    except Exception:
        return None


def new_child(parent: TraceContext | None) -> TraceContext:
    """A new span under `parent`, or the root of a new trace."""
    if parent is None:
        return TraceContext(new_trace_id(), new_span_id())
    return TraceContext(parent.trace_id, new_span_id(), parent.span_id, parent.sampled,
                        parent.tracestate)


class Attached:
    """A context made current at creation; `with` it, or call detach() when done."""

    __slots__ = ("_token", "context")

    def __init__(self, context: TraceContext | None) -> None:
        self.context = context
        self._token: contextvars.Token[TraceContext | None] | None = (
            _CURRENT.set(context) if context is not None else None)

    def detach(self) -> None:
        token = self._token
        if token is None:
            return
        try:
            _CURRENT.reset(token)
        except ValueError:
            # Called in another context than attached (a generator resumed elsewhere):
            # no error for the caller, and the token stays for a detach in the right one.
            return
        self._token = None

    def __enter__(self) -> Attached:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def activate(context: TraceContext | None) -> Attached:
    return Attached(context)


def span() -> Attached:
    """A child span of the current one (or a new trace) as the current span."""
    return Attached(new_child(current()))


def inject_trace_context(meta: dict[str, Any]) -> dict[str, Any]:
    """Write the current span into `meta` as "traceparent" (and "tracestate") and return
    `meta`. With no current span, `meta` is returned unchanged: the callee starts its own
    trace rather than claim a parent nobody recorded."""
    context = current()
    if context is None:
        return meta
    meta[TRACEPARENT] = format_traceparent(context)
    if context.tracestate:
        meta[TRACESTATE] = context.tracestate
    return meta


def attach_trace_context(meta: Any) -> Attached:
    """Make the span in `meta` (a dict from `inject_trace_context`) current, so spans
    started next are its children. A missing or invalid traceparent attaches nothing."""
    if not isinstance(meta, Mapping):
        return Attached(None)
    return Attached(parse_traceparent(meta.get(TRACEPARENT), meta.get(TRACESTATE, "")))
