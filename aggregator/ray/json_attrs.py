"""The attrs (and a definition's name) of the events the columnar path takes, worked
out once per distinct shape, not once per event.

A definition's name and attrs depend on a dozen of its fields (function, runtime env,
session, ...) that the tasks of one job share: for each distinct set of them the fast
path itself (`fast.fast_rows`) maps one stand-in event holding just those fields, so
both paths agree by construction. A lifecycle row's attrs are at most six entries in a
fixed order (`{**extras, worker_pid, ray_state, **envelope}`, as `fast._lifecycle` makes
them), so they are put together for all rows at once; only the distinct log-file texts
(`taskLogInfo`), sessions and severities pass through Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from aggregator.decode.normalize import Stamp
from aggregator.ray.columns import ROW_COLUMNS
from aggregator.ray.fast import fast_rows
from aggregator.ray.json_checks import field
from aggregator.ray.json_columns import DEFINITION, LIFECYCLE_EVENT
from aggregator.ray.values import K_CAMEL, text

_NAME: Final = ROW_COLUMNS.index("name")
_ATTRS: Final = ROW_COLUMNS.index("attrs")
_ANY_ID: Final = "AAAA"  # the stand-in's eventId: ids take no part in names and attrs
_MAP: Final = pa.map_(pa.string(), pa.string())
_SEP: Final = "\x1f"  # a JSON text never holds a raw control character
_NULL: Final = "\x1e"
_RECIPE: Final = ("eventType", "sessionName", "severity")
_MAPS_FAILED = (ValueError, TypeError, AttributeError, KeyError, IndexError)


class Definitions:
    """name, attrs and task type of each taken definition, by distinct shape."""

    def __init__(self, events: pa.StructArray, payloads: pa.StructArray, stamp: Stamp) -> None:
        codes, firsts = _distinct([field(events, n) for n in _RECIPE]
                                  + [field(payloads, n) for n in DEFINITION
                                     if n not in _PER_TASK])
        self.codes = codes
        self.names: list[str | None] = []
        self.attrs: list[dict[str, str] | None] = []
        for first in firsts:
            name, attrs = _definition(events[int(first)].as_py(), stamp)
            self.names.append(name)
            self.attrs.append(attrs)

    def failed(self) -> np.ndarray:
        """Events whose shape the fast path declines: the Python path's to map."""
        bad = np.array([a is None for a in self.attrs], dtype=bool)
        return bad[self.codes] if len(self.codes) else np.zeros(0, dtype=bool)

    def task_types(self) -> pa.Array:
        return pa.array([(a or {}).get("ray_task_type") for a in self.attrs],
                        pa.string()).take(pa.array(self.codes))

    def name_column(self) -> pa.Array:
        return pa.array(self.names, pa.string()).take(pa.array(self.codes))

    def attrs_column(self) -> pa.Array:
        return map_array([a or {} for a in self.attrs]).take(pa.array(self.codes))


_PER_TASK: Final = frozenset({"taskId", "jobId", "parentTaskId", "actorId", "taskAttempt"})


def _definition(event: dict[str, Any], stamp: Stamp) -> tuple[str | None, dict[str, str] | None]:
    """The fast path's name and attrs for an event of this shape; None where it declines."""
    try:
        kind = orjson.loads(event["eventType"])
        item: dict[str, Any] = {"eventId": _ANY_ID, "eventType": kind}
        for name in _RECIPE[1:]:
            if event[name] is not None:
                item[name] = orjson.loads(event[name])
        payload_key = K_CAMEL[kind.lower()]
        payload = event[payload_key]
        item[payload_key] = {name: orjson.loads(value) for name, value in payload.items()
                             if value is not None and name not in _PER_TASK}
        (row,) = fast_rows(item, stamp)
    except (orjson.JSONDecodeError, *_MAPS_FAILED):
        return None, None
    attrs: dict[str, str] = row[_ATTRS]
    return row[_NAME], attrs


def _distinct(columns: Sequence[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
    """A code per row for its distinct values across `columns`, and each code's first row."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = pc.binary_join_element_wise(*columns, _SEP, null_handling="replace",
                                      null_replacement=_NULL)
    encoded = key.dictionary_encode()
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    _, firsts = np.unique(codes, return_index=True)
    return codes, firsts


def map_array(maps: Sequence[dict[str, str]]) -> pa.MapArray:
    offsets = np.zeros(len(maps) + 1, dtype=np.int32)
    np.cumsum([len(m) for m in maps], out=offsets[1:])
    keys = [k for m in maps for k in m]
    values = [v for m in maps for v in m.values()]
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=_MAP)


class LifecycleAttrs:
    """The parts of each taken lifecycle event's attrs, decoded once per distinct text."""

    def __init__(self, events: pa.StructArray, payloads: pa.StructArray) -> None:
        self.log_info, log_ok = _decoded(field(payloads, "taskLogInfo"), _extra_value)
        self.session, session_ok = _decoded(field(events, "sessionName"), _session)
        self.severity, severity_ok = _decoded(field(events, "severity"), _severity)
        pid = field(payloads, "workerPid")  # checked: absent, 0 or a JSON integer
        self.pid = pc.if_else(pc.equal(pid, "0"), pa.scalar(None, pa.string()), pid)
        self.failed = ~(log_ok & session_ok & severity_ok)

    def rows(self, row_events: np.ndarray, raw_states: pa.Array) -> pa.MapArray:
        """attrs of each row: {ray_task_log_info, worker_pid, ray_state, ray_event_type,
        ray_session, ray_severity}, each where it is set, in that order."""
        per_event = [self.log_info, self.pid]
        after = [pa.array([LIFECYCLE_EVENT] * len(self.session), pa.string()),
                 self.session, self.severity]
        parts = [*(p.take(pa.array(row_events)) for p in per_event), raw_states,
                 *(p.take(pa.array(row_events)) for p in after)]
        present = np.stack([p.is_valid().to_numpy(zero_copy_only=False) for p in parts],
                           axis=1)
        values = pa.concat_arrays([p.cast(pa.string()) for p in parts])
        width = len(parts)
        rows = len(raw_states)
        order = (np.arange(width)[None, :] * rows + np.arange(rows)[:, None])[present]
        names = pa.array(_LIFE_KEYS, pa.string()).take(
            pa.array(np.broadcast_to(np.arange(width), (rows, width))[present]))
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(present.sum(axis=1), out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), names, values.take(pa.array(order)),
                                       type=_MAP)


_LIFE_KEYS: Final = ("ray_task_log_info", "worker_pid", "ray_state", "ray_event_type",
                     "ray_session", "ray_severity")


def _decoded(texts: pa.Array, decode: Any) -> tuple[pa.Array, np.ndarray]:
    """`decode` of each distinct JSON text (None: not set); and which decoded."""
    distinct = pc.unique(texts)
    values: list[str | None] = []
    bad: list[str] = []
    for raw in distinct.to_pylist():
        try:
            values.append(None if raw is None else decode(orjson.loads(raw)))
        except (orjson.JSONDecodeError, TypeError):
            values.append(None)
            bad.append(raw)
    found = pa.array(values, pa.string()).take(pc.index_in(texts, distinct))
    failed = pc.is_in(texts, pa.array(bad, pa.string())).fill_null(False).to_numpy(
        zero_copy_only=False) if bad else np.zeros(len(texts), dtype=bool)
    return found, ~failed


def _extra_value(value: Any) -> str | None:
    """As `values.extra_attrs` keeps a field: set, and not int64 zero printed "0"."""
    if not value or value == "0":
        return None
    return value if type(value) is str else text(value)


def _session(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise TypeError("not a text")  # as the fast path declines it
    return value or None


def _severity(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise TypeError("not a text")
    return None if value in (None, "", "INFO") else value
