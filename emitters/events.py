"""Queued caller tuples -> event dicts of the exact column types (runs in the sender thread).

Known fields are coerced to their column type; a value that does not fit its column, and
every unknown field, goes to `attrs` as text. NaN and infinite metrics become `nonfinite`
names. Nothing here raises for a caller's value: whatever has no JSON form is written as
its str() (or its type name when even str() fails).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from emitters.fields import AGENT_STAMPED, EVENT_FIELDS
from emitters.ops import Op

_INT64 = 2**63
_INT_LIMITS = {"int32": 2**31, "int64": _INT64}
_STAMPED = "stamped by the agent"
_COLUMNS = {name: _STAMPED if name in AGENT_STAMPED else column
            for name, column in EVENT_FIELDS.items()}
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
_JSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


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
        return Context(base, dict(identity.get("attrs") or {}))


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
BUILT_LENGTH = 3  # a built item's tuple length; emit() and op() queue 5-tuples


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
        if item[1] is BUILT:
            if start < index:
                out += _build(items[start:index], context, lost)
            try:
                out.append(built_event(item[2], context))
            except Exception:  # one bad row must not cost its neighbours their frame
                lost["unencodable"] += 1
            start = index + 1
    if start < len(items):
        out += _build(items[start:], context, lost)
    return out


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


def apply_fields(event: dict[str, Any], attrs: dict[str, str], fields: Mapping[Any, Any]) -> None:
    for key, value in fields.items():
        column = _COLUMNS.get(key)
        if column is None:
            if value is not None:
                attrs[key if type(key) is str else text(key)] = (
                    value if type(value) is str else text(value))
        elif value is None or column is _STAMPED:
            continue
        elif column == "string":
            event[key] = value if type(value) is str else text(value)
        # The common cases first, without calls: this runs for every field of every event.
        elif column == "int64" and type(value) is int and -_INT64 <= value < _INT64:
            event[key] = value
        elif column == "float64" and type(value) is float and value - value == 0.0:
            event[key] = value  # finite: inf - inf and nan - nan are nan
        else:
            _typed(event, attrs, key, column, value)


def _typed(event: dict[str, Any], attrs: dict[str, str], key: str, column: str, value: Any) -> None:
    if column in _INT_LIMITS:
        number = as_int(value, _INT_LIMITS[column])
        if number is None:
            attrs[key] = text(value)
        else:
            event[key] = number
    elif column == "float64":
        real = as_float(value)
        if real is None or not math.isfinite(real):
            attrs[key] = text(value)
        else:
            event[key] = real
    elif column == "timestamp_ns":
        _time(event, attrs, key, value)
    elif column == "map_string_float64" and isinstance(value, Mapping):
        add_metrics(event, attrs, value)
    elif column == "list_string" and isinstance(value, (list, tuple, set, frozenset)):
        names = set(event.get(key) or ()) | {text(v) for v in value}
        event[key] = sorted(names)
    elif column == "map_string_string" and isinstance(value, Mapping):
        for k, v in value.items():
            if v is not None:
                attrs[text(k)] = text(v)
    else:
        attrs[key] = text(value)


def _time(event: dict[str, Any], attrs: dict[str, str], key: str, value: Any) -> None:
    if isinstance(value, datetime) and value.tzinfo is not None:
        event[key] = int(value.timestamp()) * 1_000_000_000 + value.microsecond * 1000
    elif isinstance(value, str):
        event[key] = value  # RFC 3339: the agent parses it and says so when it cannot
    else:
        number = as_int(value, 2**63)
        if number is None or number < 0:
            attrs[key] = text(value)
        else:
            event[key] = number


def add_metrics(event: dict[str, Any], attrs: dict[str, str], values: Mapping[Any, Any]) -> None:
    """Finite numbers into `metrics`, NaN/inf names into `nonfinite`, the rest into attrs."""
    metrics: dict[str, float] = event.get("metrics") or {}
    nonfinite: set[str] = set(event.get("nonfinite") or ())
    for key, value in values.items():
        name = key if type(key) is str else text(key)
        real = as_float(value)
        if real is None:
            if value is not None:
                attrs[name] = text(value)
        elif math.isfinite(real):
            metrics[name] = real
        else:
            nonfinite.add(name)
    if metrics:
        event["metrics"] = metrics
    if nonfinite:
        event["nonfinite"] = sorted(nonfinite)


def as_int(value: Any, limit: int) -> int | None:
    if type(value) is not int:
        if isinstance(value, (bool, str, bytes)):
            return None
        try:
            value = value.__index__()
        except Exception:
            return None
        if type(value) is not int:
            return None
    return value if -limit <= value < limit else None


def as_float(value: Any) -> float | None:
    if type(value) is float:
        return value
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        return float(value)  # ints, bools, numpy and torch scalars
    except Exception:
        return None


def text(value: Any) -> str:
    """A value as attrs text: JSON for containers and literals, str() for the rest."""
    if type(value) is str:
        return value
    try:
        return _text(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return str.__str__(value)
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        return repr(value)
    if isinstance(value, (dict, list, tuple)):
        with contextlib.suppress(Exception):
            return orjson.dumps(value, default=_json_default, option=_JSON_OPTIONS).decode()
    return _str_or_type_name(value)


def _json_default(value: Any) -> str:
    return _str_or_type_name(value)


def _str_or_type_name(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def scrub(value: Any) -> Any:
    """The value with every string made valid UTF-8 (lone surrogates become escapes)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value
