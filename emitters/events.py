"""Queued caller tuples -> event dicts of the exact column types (runs in the sender thread).

The process's context (job, run, node, attrs) under every event, event ids from the
event's time, emit() and op() tuples and rows built elsewhere (the OTel exporter) made
into events; each field goes into its column through `emitters.values`, which never
raises for a caller's value.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from emitters.ops import Op
from emitters.values import add_metrics, apply_fields, text

_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


_CONTEXT_ENV = (
    ("job_id", "EVAGG_JOB_ID"), ("run_id", "EVAGG_RUN_ID"), ("node_id", "EVAGG_NODE_ID"))


@dataclass(frozen=True, slots=True)
class Context:
    """What every event of this process carries unless the event says otherwise."""

    base: dict[str, Any]  # source, job_id, run_id, node_id (strings, only those set)
    attrs: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def of(identity: Mapping[str, Any]) -> Context:
        """From configured values, else EVAGG_JOB_ID / EVAGG_RUN_ID / EVAGG_NODE_ID."""
        base: dict[str, Any] = {"source": identity.get("source") or "evagg"}
        for key, env in _CONTEXT_ENV:
            value = identity.get(key) or os.environ.get(env)
            if value:
                base[key] = value
        return Context(base, {**launcher_attrs(), **dict(identity.get("attrs") or {})})


def launcher_attrs() -> dict[str, str]:
    """Under torchrun (it sets TORCHELASTIC_RUN_ID), the `rank` and `world_size` it gives
    the process, so that every event of a rank (its own ops, its DataLoader workers',
    which inherit the environment) says which rank it came from; none elsewhere."""
    return environment_rank() if os.environ.get("TORCHELASTIC_RUN_ID") else {}


def environment_rank() -> dict[str, str]:
    """`rank` and `world_size` from RANK and WORLD_SIZE, as launchers set them; none
    unless both are whole numbers."""
    rank, world_size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world_size.isdigit():
        return {"rank": rank, "world_size": world_size}
    return {}


class ContextChange:
    """Queued by configure(), so that it applies to the events emitted after it."""

    __slots__ = ("identity",)

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity


def event_ids(times: Sequence[int]) -> list[str]:
    """UUIDv7 strings shaped as `ids.new_event_id` makes them, with one urandom call.

    A batch costs 0.5 us an id against 1.3 us for one call per id, and this runs under
    the GIL that the callers of emit() need.
    """
    rnd = os.urandom(10 * len(times)).hex()
    out: list[str] = []
    last_ms = -1
    prefix = ""
    for i, t in enumerate(times):
        ms = t // 1_000_000
        if ms != last_ms:
            stamp = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
            prefix = f"{stamp[:8]}-{stamp[8:]}-7"
            last_ms = ms
        r = rnd[20 * i : 20 * i + 20]
        out.append(f"{prefix}{r[:3]}-{_VARIANT[r[3]]}{r[4:7]}-{r[7:19]}")
    return out


class _Built:
    """Marks a queued (0, BUILT, event) whose event was built finished (Emitter.enqueue_built)."""

    __slots__ = ()


BUILT = _Built()
BUILT_LENGTH = 3  # a built or deferred item's tuple length; emit() and op() queue 5-tuples


class _Deferred:
    """Marks a queued (0, DEFERRED, (build, count)): `count` events that `build()` makes
    finished, in the sender thread (Emitter.enqueue_deferred); the count-1 items queued
    after it are (0, DEFERRED, None), so that the queue counts one item per event."""

    __slots__ = ()


DEFERRED = _Deferred()
DEFERRED_PLACE = (0, DEFERRED, None)


def build_events(items: Sequence[tuple[Any, ...]], context: Context,
                 lost: Counter[str]) -> list[dict[str, Any]]:
    """One dict per queued item, in order; an event id only where the caller gave none.

    An item that fails anyway (a Mapping whose items() raises, say) is counted in `lost`
    as `unencodable` and skipped; the others are kept. A built item only takes the context.
    """
    if BUILT_LENGTH in map(len, items):  # a scan in C: costs emit()'s events about 1%
        return _with_built(items, context, lost)
    return _build(items, context, lost)


def _build(items: Sequence[tuple[Any, ...]], context: Context,
           lost: Counter[str]) -> list[dict[str, Any]]:
    ids = event_ids([item[0] for item in items])
    out: list[dict[str, Any]] = []
    for item, event_id in zip(items, ids, strict=True):
        try:
            event = _op_event(item, context) if type(item[1]) is Op else _plain_event(item, context)
        except Exception:
            lost["unencodable"] += 1
            continue
        event.setdefault("event_id", event_id)
        out.append(event)
    return out


def _with_built(items: Sequence[tuple[Any, ...]], context: Context,
                lost: Counter[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    start = 0  # the first item of the current run of emit()/op() items
    for index, item in enumerate(items):
        marker = item[1]
        if marker is BUILT or marker is DEFERRED:
            if start < index:
                out += _build(items[start:index], context, lost)
            if marker is DEFERRED:
                if item[2] is not None:
                    build, count = item[2]
                    out += _deferred_events(build, count, context, lost)
            else:
                try:
                    out.append(built_event(item[2], context))
                except Exception:  # one bad row must not cost its neighbours their frame
                    lost["unencodable"] += 1
            start = index + 1
    if start < len(items):
        out += _build(items[start:], context, lost)
    return out


def _deferred_events(build: Callable[[], Sequence[dict[str, Any]]], count: int,
                     context: Context, lost: Counter[str]) -> list[dict[str, Any]]:
    """The `count` events a deferred item stands for (queued and counted as emitted):
    those `build` fails to make are counted as `unencodable`, any past `count` dropped
    uncounted, as they were never counted emitted."""
    try:
        events = [built_event(e, context) for e in build()[:count]]
    except Exception:
        events = []
    lost["unencodable"] += count - len(events)
    return events


def built_event(event: dict[str, Any], context: Context) -> dict[str, Any]:
    """A built event with the context added as `_plain_event` adds it: the event's own
    columns and attrs win."""
    for key, value in context.base.items():
        if key not in event:
            event[key] = value
    if context.attrs:
        event["attrs"] = {**context.attrs, **event.get("attrs", {})}
    return event


def _plain_event(item: tuple[Any, ...], context: Context) -> dict[str, Any]:
    time_ns, kind, name, state, fields = item
    event = context.base.copy()
    event["time"] = time_ns
    event["kind"] = kind if type(kind) is str else text(kind)
    if name is not None:
        event["name"] = name if type(name) is str else text(name)
    if state is not None:
        event["state"] = state if type(state) is str else text(state)
    attrs: dict[str, str] = {}
    if fields:
        apply_fields(event, attrs, fields)
    return _finish(event, attrs, context)


def _op_event(item: tuple[Any, ...], context: Context) -> dict[str, Any]:
    time_ns, op, state, duration_ns, outcome = item
    event = context.base.copy()
    event["time"] = time_ns
    event["kind"] = "op"
    event["name"] = op.name if type(op.name) is str else text(op.name)
    event["state"] = state
    event["task_id"] = op.task_id
    event["span_id"] = op.task_id  # what the ops view pairs STARTED and the end by
    if op.parent is not None:
        event["parent_id"] = op.parent.task_id
    if op.span is not None:  # a span of the trace that was current (fields may say else)
        event["trace_id"] = op.span.trace_id
        event["parent_span_id"] = op.span.span_id
    attrs: dict[str, str] = {}
    if op.fields:
        apply_fields(event, attrs, op.fields)
    if duration_ns is not None:
        event["duration_s"] = duration_ns / 1e9
    if outcome is not None:
        metrics, updates, error = outcome
        if updates:
            apply_fields(event, attrs, updates)
        if metrics:
            add_metrics(event, attrs, metrics)
        if error:
            event.update(error)
    return _finish(event, attrs, context)


def _finish(event: dict[str, Any], attrs: dict[str, str], context: Context) -> dict[str, Any]:
    if context.attrs:
        attrs = {**context.attrs, **attrs}
    if attrs:
        event["attrs"] = attrs
    return event
