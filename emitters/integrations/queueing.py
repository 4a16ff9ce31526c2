"""Queue time across a hand-off, and a request ledger: who asked, who started, who answered.

Producer side (an API server queueing a request for a trainer, a driver submitting a task):

    meta = emitters.queueing.enqueue({}, request_id=req.id, name="generate")
    queue.put((payload, meta))            # meta: a small dict of str/int, JSON and pickle safe

Consumer side, in whatever process picks the work up:

    with emitters.queueing.start_work(meta, name="generate") as op:
        op.metric(tokens=n)               # an ordinary emitters.Op

Events (kind "request", task_id = the request id, run_id from the producer):

    ENQUEUED   at enqueue(); its time is the stamp carried in meta
    STARTED    when start_work() enters; metrics.queue_s = start - enqueue (seconds)
    ANSWERED   when the block ends normally; duration_s = work time,
               metrics.queue_s and metrics.latency_s (enqueue to answer)
    FAILED     when the block raises; the same, plus error_type/error_message/stack_trace

The work itself is also an op (kind "op", the consumer's `name`) whose STARTED and terminal
events both carry metrics.queue_s and attrs.request_id, and the trace fields of a span
that is a child of the producer's (W3C `traceparent` in meta, see emitters.tracecontext).
queue_s compares two processes' wall clocks: across hosts it includes their clock skew
(it is clamped at 0). Re-running the same meta (a retry) adds another STARTED and outcome.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from emitters.ids import new_span_id
from emitters.ops import Op, error_fields
from emitters.tracecontext import (
    Attached,
    attach_trace_context,
    current,
    inject_trace_context,
    span,
)

if TYPE_CHECKING:
    from emitters.emitter import Emitter

KIND = "request"
ENQUEUED = "ENQUEUED"
STARTED = "STARTED"
ANSWERED = "ANSWERED"
FAILED = "FAILED"

# Keys written into the caller's meta dict (beside "traceparent"/"tracestate").
ENQUEUED_NS = "evagg_enqueued_ns"
REQUEST_ID = "evagg_request_id"
REQUEST_NAME = "evagg_request_name"
RUN_ID = "evagg_run_id"

_time_ns = time.time_ns


def _emitter(emitter: Emitter | None) -> Emitter:
    if emitter is not None:
        return emitter
    import emitters

    return emitters.get_emitter()


def _context_run_id(emitter: Emitter) -> str | None:
    return emitter.identity.get("run_id") or os.environ.get("EVAGG_RUN_ID") or None


def enqueue(meta: MutableMapping[str, Any] | None = None, *, request_id: str | None = None,
            name: str = "request", run_id: str | None = None,
            emitter: Emitter | None = None, **fields: Any) -> dict[str, Any]:
    """Stamp the enqueue time, request id and trace context into `meta`; emit ENQUEUED.

    Returns `meta` as a plain dict (a new one when None was given; a given dict is
    updated in place and returned). Extra `fields` go on the ENQUEUED event. Never raises
    for a caller's value (the emitter's rules: unknown fields become attrs).
    """
    out: dict[str, Any] = meta if isinstance(meta, dict) else dict(meta or {})
    target = _emitter(emitter)
    request = str(request_id) if request_id else new_span_id()
    run = run_id or _context_run_id(target)
    now = _time_ns()
    inject_trace_context(out)
    out[ENQUEUED_NS] = now
    out[REQUEST_ID] = request
    out[REQUEST_NAME] = name
    if run:
        out[RUN_ID] = run
    context = current()
    trace = context.fields() if context is not None else {}
    target.emit(kind=KIND, name=name, state=ENQUEUED, task_id=request, time=now,
                **_run(run), **trace, **fields)
    return out


def start_work(meta: Mapping[str, Any] | None, *, name: str | None = None,
               step: int | None = None, emitter: Emitter | None = None,
               **fields: Any) -> Work:
    """`with start_work(meta, name=...) as op:`: the consumer's side of `enqueue`."""
    return Work(meta if isinstance(meta, Mapping) else {}, name, step, _emitter(emitter), fields)


class Work:
    """One piece of queued work being done; enter it with `with` or `async with`."""

    def __init__(self, meta: Mapping[str, Any], name: str | None, step: int | None,
                 emitter: Emitter, fields: dict[str, Any]) -> None:
        self.request_id: str | None = _text_or_none(meta.get(REQUEST_ID))
        self.name = name or _text_or_none(meta.get(REQUEST_NAME)) or "request"
        self.run_id = _text_or_none(meta.get(RUN_ID))
        self.enqueued_ns = _stamp(meta.get(ENQUEUED_NS))
        self.queue_s: float | None = None
        self._meta = meta
        self._step = step
        self._emitter = emitter
        self._fields = fields
        self._op: Op | None = None
        self._contexts: list[Attached] = []
        self._trace: dict[str, str] = {}
        self._started_perf = 0

    def __enter__(self) -> Op:
        now = _time_ns()
        if self.enqueued_ns is not None:
            self.queue_s = max(0.0, (now - self.enqueued_ns) / 1e9)
        self._contexts.append(attach_trace_context(self._meta))
        work_span = span()
        self._contexts.append(work_span)
        trace = work_span.context.fields() if work_span.context is not None else {}
        self._trace = trace
        queued = {"queue_s": self.queue_s} if self.queue_s is not None else {}
        self._request_event(STARTED, now, trace, {"metrics": queued})
        op_fields: dict[str, Any] = {**self._fields, **_run(self.run_id), **trace}
        if queued:
            op_fields["metrics"] = queued
        if self.request_id is not None:
            op_fields["request_id"] = self.request_id
        self._op = self._emitter.op(self.name, step=self._step, **op_fields)
        self._started_perf = time.perf_counter_ns()
        return self._op.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._op is not None:
                self._op.__exit__(exc_type, exc, tb)
            now = _time_ns()
            trace = self._trace
            outcome: dict[str, Any] = {
                "duration_s": (time.perf_counter_ns() - self._started_perf) / 1e9,
                "metrics": self._outcome_metrics(now)}
            if exc_type is None:
                self._request_event(ANSWERED, now, trace, outcome)
            else:
                self._request_event(FAILED, now, trace, {**outcome,
                                                         **error_fields(exc_type, exc, tb)})
        finally:
            while self._contexts:
                self._contexts.pop().detach()

    async def __aenter__(self) -> Op:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    def _outcome_metrics(self, now: int) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.queue_s is not None:
            out["queue_s"] = self.queue_s
        if self.enqueued_ns is not None:
            out["latency_s"] = max(0.0, (now - self.enqueued_ns) / 1e9)
        return out

    def _request_event(self, state: str, now: int, trace: dict[str, str],
                       extra: dict[str, Any]) -> None:
        if self.request_id is None:
            return  # nothing was enqueued through enqueue(): only the op is recorded
        self._emitter.emit(kind=KIND, name=self.name, state=state, task_id=self.request_id,
                           time=now, **_run(self.run_id), **trace, **extra)


def _run(run_id: str | None) -> dict[str, str]:
    return {"run_id": run_id} if run_id else {}


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _stamp(value: Any) -> int | None:
    """The enqueue stamp, if it is a plausible ns timestamp (meta may come from anywhere)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value
