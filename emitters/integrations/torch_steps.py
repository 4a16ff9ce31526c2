"""A finished training step as op events: what TrainingTracker hands the emitter.

Kept apart from the hooks in emitters/integrations/torch.py: these functions need no torch, only the
marks (wall-clock ns, and a CUDA event pair's elapsed time where there is one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emitters import tracecontext
from emitters.events import event_ids
from emitters.ids import new_span_id

PHASES = ("forward", "backward", "optimizer_step")
Mark = tuple[int, Any]  # (wall-clock ns, CUDA event or None)


@dataclass(slots=True)
class Step:
    step: int
    start: Mark
    phases: dict[str, list[tuple[Mark, Mark]]] = field(default_factory=dict)
    data_wait_s: float | None = None  # None: no wrapped loader timed a wait for this step
    metrics: dict[str, float] = field(default_factory=dict)
    deferred: dict[str, Any] = field(default_factory=dict)  # name -> CPU tensor being filled
    end: Mark | None = None
    peak_memory_bytes: int | None = None
    # The span current when the step's first op began (None: none was); False: not looked.
    trace: tracecontext.TraceContext | bool | None = False
    error: dict[str, str] | None = None  # the exception the step raised
    failed: tuple[str, ...] = ()  # the phases in flight when it raised

    def timed_metrics(self) -> dict[str, float]:
        """The caller's metrics, and the batch's wait where a wrapped loader timed one."""
        values = dict(self.metrics)
        if self.data_wait_s is not None:
            values["data_wait_s"] = self.data_wait_s
        return values

    def active(self) -> bool:
        return bool(self.phases or self.metrics or self.deferred or self.data_wait_s
                    or self.error)


class StepBuild:
    """A finished step as the emitter takes it (Emitter.enqueue_deferred): called, its
    events as rows (step_events); with the other steps of a frame, their events as columns
    (columns_of), for the emitter's straight columns path (emitters/columns_items.py)."""

    __slots__ = ("attrs", "done", "ids", "name")

    def __init__(self, done: Step, name: str, ids: dict[str, str],
                 attrs: dict[str, str] | None = None) -> None:
        self.done = done
        self.name = name
        self.ids = ids
        self.attrs = attrs or {}  # on every event of the step (a distributed run's rank)

    def __call__(self) -> list[dict[str, Any]]:
        return step_events(self.done, self.name, self.ids, self.attrs)

    @staticmethod
    def columns_of(builds: Sequence[StepBuild]) -> dict[str, list[Any]] | None:
        """The events step_events makes of these steps, as columns; None where a step is
        not a plain CPU one (failed, in a trace, timed on CUDA, a phase called more than
        once, a metric that is not a finite float), which the rows path then takes."""
        keys = tuple(builds[0].ids)
        attrs = builds[0].attrs
        times: list[int] = []
        names: list[str] = []
        steps: list[int] = []
        durations: list[float] = []
        metrics: list[dict[str, float] | None] = []
        ids: dict[str, list[str]] = {key: [] for key in keys}
        for build in builds:
            done = build.done
            if (done.error or done.trace or done.deferred or done.peak_memory_bytes is not None
                    or tuple(build.ids) != keys or build.attrs != attrs):
                return None
            values = done.timed_metrics()
            if values and (set(map(type, values.values())) != {float} or not all(
                    map(math.isfinite, values.values()))):
                return None
            before = len(times)
            for phase in PHASES:
                spans = done.phases.get(phase)
                if not spans:
                    continue
                if len(spans) != 1 or spans[0][0][1] is not None or spans[0][1][1] is not None:
                    return None
                (start, _), (end, _) = spans[0]
                times.append(start)
                names.append(phase)
                durations.append((end - start) / 1e9)
            times.append(done.start[0])
            names.append(build.name)
            durations.append(((done.end or done.start)[0] - done.start[0]) / 1e9)
            rows = len(times) - before
            steps += [done.step] * rows
            metrics += [None] * (rows - 1)
            metrics.append(values or None)
            for key, column in ids.items():
                column += [build.ids[key]] * rows
        n = len(times)
        columns: dict[str, list[Any]] = {
            "time": times, "kind": ["op"] * n, "source": ["torch"] * n, "name": names,
            "state": ["FINISHED"] * n, "step": steps, "duration_s": durations,
            "metrics": metrics, **ids, "event_id": event_ids(times)}
        if attrs:
            columns["attrs"] = [attrs] * n
        return columns


def step_event_count(done: Step) -> int:
    """How many events step_events makes of `done`: one per phase it timed, and the step."""
    phases = done.phases
    return 1 + sum(1 for phase in PHASES if phases.get(phase))


def step_events(done: Step, name: str, ids: dict[str, str],
                attrs: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The step's events, built as emit() would build them (typed, an id each); `attrs`
    (a distributed run's rank) on each of them."""
    if done.error or done.trace or done.deferred or done.peak_memory_bytes is not None:
        return _with_attrs(_step_events(done, name, ids), attrs)
    events: list[dict[str, Any]] = []
    times: list[int] = []
    phases = done.phases
    for phase in PHASES:
        spans = phases.get(phase)
        if not spans:
            continue
        (start, start_event), (end, end_event) = spans[0]
        if len(spans) == 1 and start_event is None and end_event is None:  # one CPU call
            event = {"kind": "op", "source": "torch", "name": phase, "state": "FINISHED",
                     "time": start, "step": done.step, "duration_s": (end - start) / 1e9, **ids}
        else:
            event = _phase_event(done, phase, spans, ids)
        events.append(event)
        times.append(start)
    metrics = done.timed_metrics()
    end_ns = (done.end or done.start)[0]
    step_event: dict[str, Any] = {
        "kind": "op", "source": "torch", "name": name, "state": "FINISHED",
        "time": done.start[0], "step": done.step,
        "duration_s": (end_ns - done.start[0]) / 1e9, **ids}
    if metrics and all(map(math.isfinite, metrics.values())):
        step_event["metrics"] = metrics
    elif metrics:
        finite, nonfinite = _split_finite(metrics)
        if finite:
            step_event["metrics"] = finite
        step_event["nonfinite"] = nonfinite
    events.append(step_event)
    times.append(done.start[0])
    for event, event_id in zip(events, event_ids(times), strict=True):
        event["event_id"] = event_id
    return _with_attrs(events, attrs)


def _with_attrs(events: list[dict[str, Any]], attrs: dict[str, str] | None
                ) -> list[dict[str, Any]]:
    if attrs:
        for event in events:
            own = event.get("attrs")
            event["attrs"] = {**attrs, **own} if own else attrs
    return events


def _step_events(done: Step, name: str, ids: dict[str, str]) -> list[dict[str, Any]]:
    """step_events for any step: failed, in a trace, or timed on CUDA."""
    events = [_phase_event(done, phase, spans, ids) for phase in PHASES
              if (spans := done.phases.get(phase))]
    events.append(_step_event(done, name, ids))
    _join_trace(events, done.trace)
    for event, event_id in zip(events, event_ids([e["time"] for e in events]), strict=True):
        event["event_id"] = event_id
    return events


def _phase_event(done: Step, phase: str, spans: list[tuple[Mark, Mark]],
                 ids: dict[str, str]) -> dict[str, Any]:
    failed = phase in done.failed  # in flight when the step raised
    event: dict[str, Any] = {
        "kind": "op", "source": "torch", "name": phase,
        "state": "FAILED" if failed else "FINISHED", "time": spans[0][0][0],
        "step": done.step, "duration_s": float(sum(_elapsed_s(a, b) for a, b in spans)),
        **ids}
    if len(spans) > 1:
        event["attrs"] = {"calls": str(len(spans))}
    if failed and done.error:
        event.update(done.error)
    return event


def _step_event(done: Step, name: str, ids: dict[str, str]) -> dict[str, Any]:
    metrics, nonfinite = _split_finite(_step_metrics(done))
    end = done.end or done.start
    event: dict[str, Any] = {
        "kind": "op", "source": "torch", "name": name,
        "state": "FAILED" if done.error else "FINISHED", "time": done.start[0],
        "step": done.step, "duration_s": (end[0] - done.start[0]) / 1e9, **ids}
    if metrics:
        event["metrics"] = metrics
    if nonfinite:
        event["nonfinite"] = nonfinite
    if done.error:
        event.update(done.error)
    return event


def _join_trace(events: list[dict[str, Any]], context: object) -> None:
    """Each op a span of its own: the step (the last event) a child of the span that was
    current in it, its phases children of the step, so a trace nests each step's phases
    under it instead of listing every step's ops side by side."""
    if not isinstance(context, tracecontext.TraceContext):
        return
    step_span = new_span_id()
    *phases, step = events
    for event in phases:
        event["trace_id"] = context.trace_id
        event["span_id"] = new_span_id()
        event["parent_span_id"] = step_span
    step["trace_id"] = context.trace_id
    step["span_id"] = step_span
    step["parent_span_id"] = context.span_id


def _elapsed_s(start: Mark, end: Mark) -> float:
    if start[1] is not None and end[1] is not None:
        return float(start[1].elapsed_time(end[1])) / 1e3
    return (end[0] - start[0]) / 1e9


def _step_metrics(done: Step) -> dict[str, float]:
    values = done.timed_metrics()
    for name, host_tensor in done.deferred.items():
        values[name] = float(host_tensor.item())
    if done.peak_memory_bytes is not None:
        values["peak_memory_bytes"] = float(done.peak_memory_bytes)
    return values


def _split_finite(values: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """NaN and infinities are named in `nonfinite`, never stored as numbers."""
    finite = {k: v for k, v in values.items() if math.isfinite(v)}
    return finite, sorted(k for k in values if k not in finite)
