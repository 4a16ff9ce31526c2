"""emit() tuples, and deferred builds that can give columns, straight into columns,
without an event dict (runs in the sender thread).

The common case, emit() called in a loop with the same plain fields, costs one pass per
column in C (itemgetter, map, set of types) instead of `values.apply_fields` per field
per event and a dict per event. Each column is taken only where the values are the ones
`values.apply_fields` would keep as they are (str for text columns, int in range, finite
float, a map of finite floats for metrics, unknown fields made text for attrs); anything
else (op() items, a field that varies, None, a `time`, a NaN...) returns None and the
items take the dict path (`events.build_events`), which gives the same events.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, Final

from emitters.events import DEFERRED, Context, event_ids
from emitters.fields import AGENT_STAMPED, EVENT_FIELDS
from emitters.values import text

_INT_LIMITS: Final = {"int32": 2**31, "int64": 2**63}
_NONE: Final = type(None)
_EMIT_LENGTH: Final = 5
_TIME, _KIND, _NAME, _STATE, _FIELDS = (itemgetter(i) for i in range(5))


def emit_columns(items: Sequence[tuple[Any, ...]], context: Context) -> dict[str, list[Any]] | None:
    """The columns of these emit() items (without the context's base), or None."""
    n = len(items)
    if not n or set(map(len, items)) != {_EMIT_LENGTH}:
        return None
    kinds = list(map(_KIND, items))
    if set(map(type, kinds)) != {str} or "" in kinds:
        return None  # an op() item, a built one, or a kind the agent would reject
    fields = list(map(_FIELDS, items))
    keys = list(map(tuple, fields))
    names = keys[0]
    if keys.count(names) != n:
        return None
    columns: dict[str, list[Any]] = {"time": list(map(_TIME, items)), "kind": kinds}
    for label, getter in (("name", _NAME), ("state", _STATE)):
        values = list(map(getter, items))
        if not set(map(type, values)) <= {str, _NONE}:
            return None
        if values.count(None) != n:
            columns[label] = values
    unknown: list[tuple[str, list[str]]] = []
    for name, values in zip(names, _transpose(fields, names), strict=True):
        column = EVENT_FIELDS.get(name)
        if column is None:
            if None in values:
                return None
            unknown.append((name, values if set(map(type, values)) == {str}
                            else list(map(text, values))))
        elif name in AGENT_STAMPED:
            continue
        elif not _fits(column, values):
            return None
        else:
            columns[name] = values
    if "event_id" not in columns:
        columns["event_id"] = event_ids(columns["time"])
    attrs = _attrs(context.attrs, unknown, n)
    if attrs is not None:
        columns["attrs"] = attrs
    return columns


def deferred_columns(items: Sequence[tuple[Any, ...]], context: Context
                     ) -> dict[str, list[Any]] | None:
    """The columns of these deferred items (Emitter.enqueue_deferred), without the
    context's base, when every build is of one type whose `columns_of(builds)` gives them
    ({column: values} for exactly the events the builds were queued for), else None.
    emitters/integrations/torch_steps.py's StepBuild is one: a training step's events."""
    builds = []
    for item in items:
        if len(item) != 3 or item[1] is not DEFERRED:
            return None
        if item[2] is not None:
            builds.append(item[2])
    if not builds:
        return None
    kind = type(builds[0][0])
    columns_of = getattr(kind, "columns_of", None)
    if columns_of is None or any(type(build) is not kind for build, _ in builds):
        return None
    columns: dict[str, list[Any]] | None = columns_of([build for build, _ in builds])
    if columns is None or len(columns["time"]) != len(items):
        return None  # a build made another count than it was queued for: the rows path
    if context.attrs:
        own = columns.get("attrs")
        columns["attrs"] = ([context.attrs] * len(items) if own is None else
                            [context.attrs if a is None else {**context.attrs, **a} for a in own])
    return columns


def _transpose(fields: list[dict[str, Any]], names: tuple[str, ...]) -> list[list[Any]]:
    if not names:
        return []
    if len(names) == 1:
        return [list(map(itemgetter(names[0]), fields))]
    return list(map(list, zip(*map(itemgetter(*names), fields), strict=True)))


def _fits(column: str, values: list[Any]) -> bool:
    """Whether apply_fields would store each value as it is in this column."""
    types = set(map(type, values))
    if column == "string":
        return types == {str}
    if column in _INT_LIMITS:
        limit = _INT_LIMITS[column]
        return types == {int} and -limit <= min(values) and max(values) < limit
    if column == "float64":
        return types == {float} and all(map(math.isfinite, values))
    if column == "map_string_float64":
        if types != {dict} or {} in values:
            return False
        numbers = list(chain.from_iterable(map(dict.values, values)))
        return (set(map(type, chain.from_iterable(values))) == {str}
                and set(map(type, numbers)) == {float} and all(map(math.isfinite, numbers)))
    return False  # time, attrs, nonfinite: the dict path knows their rules


def _attrs(context: dict[str, str], unknown: list[tuple[str, list[str]]],
           n: int) -> list[Any] | None:
    """Each row's attrs: the context's, then the unknown fields (which win on a clash)."""
    if not unknown:
        return [context] * n if context else None
    names = [name for name, _ in unknown]
    rows = map(dict, map(zip, repeat(names), zip(*(values for _, values in unknown),
                                                 strict=True)))
    if not context:
        return list(rows)
    return [{**context, **row} for row in rows]
