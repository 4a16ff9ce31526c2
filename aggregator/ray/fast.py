"""The fast path for the bulk of Ray's export: task definition, task lifecycle and task
profile events straight to row tuples (`columns.ROW_COLUMNS`), with no row dict and no per-field
normalization.

It gives exactly the rows that the careful path (`events.map_event`, then
`normalize.normalize_event`) gives for the same event, using the same helpers; the
differential tests in tests/aggregator/ray/test_ray_batch.py hold it to that. Whatever it is
not sure of (another event type, a missing eventId, a value of an odd type, an id that is
not base64, an attempt out of range) it declines by raising, and the caller hands that
event to the careful path, which maps it or names the reason it cannot.

Times: with `eager=False` a row keeps Ray's RFC 3339 text as is, and `columns.py`
converts the whole column in one cast, which takes UTC texts with 0-9 fraction digits
("...T12:05:22Z" to "...T12:05:22.487696773Z"). If any text is of another shape (an
offset, a lower-case "t"), names no real time or is out of range, the caller maps the
batch again with `eager=True`: times are then converted event by event, with the
careful path's parser, and only an event whose time that parser refuses or that lies
before 1970 or past int64 nanoseconds declines to the careful path (which rejects that row).

Caches (envelope attrs, function names, states) are keyed on values from outside:
anything but a str (or None) declines first, since 1, True and 1.0 are one dict key but
different texts; values too long to be worth keeping are mapped every time.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from aggregator.decode.normalize import Stamp
from aggregator.ray.columns import RowTuple
from aggregator.ray.entities import PROFILE_KIND
from aggregator.ray.errors import error_columns
from aggregator.ray.task_shapes import (
    DEFINITION_TAKEN,
    ENVELOPE_TAKEN,
    ERROR_TAKEN,
    LIFECYCLE_TAKEN,
    PROFILE_ENTRY_TAKEN,
    PROFILE_PAYLOAD,
    PROFILE_TAKEN,
    STATE_OF,
    envelope_attrs,
    function_name,
    function_parts,
    task_state,
    transitions,
)
from aggregator.ray.values import (
    HEX_CACHE,
    K_CAMEL,
    K_SNAKE,
    MAX_CACHED_KEY,
    Keys,
    b64_hex,
    creation_actor_id,
    extra_attrs,
    keep,
    runtime_env,
    time_ns,
    to_int,
)

Time = int | str  # integer ns, or Ray's RFC 3339 text for `columns.py` to convert
_TIME_LIMIT: Final = 2**63
_INT32_LIMIT: Final = 2**31


class Declined(ValueError):
    """The fast path leaves this event to the careful path."""


class OtherEventType(Declined):
    """Not a task definition, lifecycle or profile event: the careful path's to map, as
    planned."""


def fast_rows(item: Any, stamp: Stamp, eager: bool = False) -> list[RowTuple]:
    """Row tuples for one task event; raises (Declined or the error of a helper) for any
    event the careful path must take."""
    if type(item) is not dict:
        raise OtherEventType("not an object")
    snake = "event_type" in item or "event_id" in item
    event_type: Any = item.get("eventType") or item.get("event_type")
    spec = _MAPPERS.get(event_type)
    if spec is None:
        raise OtherEventType("not a task event")
    mapper, camel_key, snake_key = spec
    k, payload_key = (K_SNAKE, snake_key) if snake else (K_CAMEL, camel_key)
    payload = item.get(payload_key)
    if type(payload) is not dict:
        raise Declined("no payload")
    raw_id = item.get(k["event_id"])
    if not raw_id or type(raw_id) is not str:
        raise Declined("no eventId")  # the careful path digests the content instead
    node: Any = item.get(k["node_id"])
    envelope = _Envelope(
        binascii.a2b_base64(raw_id, strict_mode=True).hex(),
        HEX_CACHE.get(node) or b64_hex(node, k["node_id"]) or stamp.node_id or None,
        _envelope_attrs(item, k, event_type, payload_key), stamp.host or None, item, stamp,
        eager)
    return mapper(payload, k, envelope)


class _Envelope(NamedTuple):
    """What every row of one Ray event shares (as `events._stamp_envelope` adds it)."""

    event_hex: str
    node_hex: str | None
    attrs: dict[str, str]  # shared by the rows of many events: never changed
    host: str | None
    item: dict[str, Any]
    stamp: Stamp
    eager: bool

    def time(self) -> Time:
        """The envelope's timestamp, for rows without a time of their own."""
        text = self.item.get("timestamp")
        if not text:
            return self.stamp.received_ns
        if type(text) is not str:
            raise Declined("timestamp is not a string")
        return _checked(time_ns(text, "timestamp")) if self.eager else text


def _envelope_attrs(item: dict[str, Any], k: Keys, event_type: str,
                    payload_key: str) -> dict[str, str]:
    """The envelope's attrs; one dict for all events of a type, session and severity."""
    session, severity = item.get(k["session_name"]), item.get("severity")
    if not _plain(session) or not _plain(severity):
        # 1, True and 1.0 are one dict key but "1", "True" and "1.0" as text
        raise Declined("session or severity is not a string")
    if not item.keys() <= ENVELOPE_TAKEN.wire(k, payload_key):  # extras: their values count
        return envelope_attrs(item, k, event_type, payload_key)
    shape = (event_type, session, severity)
    attrs = _ENVELOPE_ATTRS.get(shape)
    if attrs is None:
        attrs = envelope_attrs(item, k, event_type, payload_key)
        if _short(shape):
            keep(_ENVELOPE_ATTRS, shape, attrs, ENVELOPE_CACHE_SIZE)
    return attrs


ENVELOPE_CACHE_SIZE = 256
FUNCTION_CACHE_SIZE = 4096
_ENVELOPE_ATTRS: dict[tuple[Any, ...], dict[str, str]] = {}


def _plain(value: Any) -> bool:
    return value is None or type(value) is str


def _short(parts: tuple[Any, ...]) -> bool:
    """Every part short enough to be worth keeping in a cache key."""
    return all(x is None or len(x) <= MAX_CACHED_KEY for x in parts)


def _checked(ns: int) -> int:
    if not 0 <= ns < _TIME_LIMIT:
        raise Declined("time out of range")  # the careful path rejects that row alone
    return ns


def _attempt(p: dict[str, Any], key: str) -> int:
    attempt = p.get(key, 0)
    if type(attempt) is not int:
        attempt = to_int(attempt, key)
    if not -_INT32_LIMIT <= attempt < _INT32_LIMIT:
        raise Declined("attempt out of range")
    return attempt


def _int64(value: Any, key: str) -> int:
    """`to_int` for the int64 Ray sends as text, with the common case first."""
    if type(value) is str and value.isascii() and value.isdigit():
        return int(value)
    return to_int(value, key)


def _hex(p: dict[str, Any], key: str) -> str | None:
    value: Any = p.get(key)
    return (HEX_CACHE.get(value) or b64_hex(value, key)) if value else None


def _function(p: dict[str, Any], k: Keys) -> str | None:
    """`events.function_name`, cached: the tasks of a job share a few functions."""
    parts = function_parts(p, k)
    if not all(map(_plain, parts)):  # as in _envelope_attrs: 1 and 1.0 are one key
        raise Declined("a function name part is not a string")
    found = _FUNCTIONS.get(parts)
    if found is None:
        found = function_name(parts) or ""
        if _short(parts):
            keep(_FUNCTIONS, parts, found, FUNCTION_CACHE_SIZE)
    return found or None


_FUNCTIONS: dict[tuple[Any, ...], str] = {}


def _definition(p: dict[str, Any], k: Keys, env: _Envelope) -> list[RowTuple]:
    function = _function(p, k)
    attrs = extra_attrs(p, k, DEFINITION_TAKEN)
    attrs.setdefault("ray_task_type", "ACTOR_TASK" if k["actor_func"] in p else "NORMAL_TASK")
    if function:
        attrs["ray_function"] = function
    placement = _hex(p, k["placement_group_id"])
    if placement and placement.strip("f"):  # all 0xff is the nil id
        attrs["ray_placement_group_id"] = placement
    env_text = runtime_env(p.get(k["serialized_runtime_env"]))
    if env_text:
        attrs["ray_runtime_env"] = env_text
    attrs.update(env.attrs)
    name = p.get(k["task_name"]) or p.get(k["actor_task_name"]) or function
    if name is not None and type(name) is not str:
        raise Declined("name is not a string")
    # ROW_COLUMNS: event_id, time, kind, source, name, state, task_id, attempt, parent_id,
    # job_id, run_id, node_id, worker_id, actor_id, host, trace_id, span_id, parent_span_id,
    # step, duration_s, error_type, error_message, stack_trace, metrics, nonfinite, attrs
    task_id = _hex(p, k["task_id"])
    actor_id = _hex(p, k["actor_id"]) or creation_actor_id(attrs["ray_task_type"], task_id)
    return [(env.event_hex, env.time(), "task", "ray", name, "DEFINED",
             task_id, _attempt(p, k["task_attempt"]),
             _hex(p, k["parent_task_id"]), _hex(p, k["job_id"]), None, env.node_hex, None,
             actor_id, env.host, None, None, None, None, None, None, None, None,
             None, None, attrs)]


def _lifecycle(p: dict[str, Any], k: Keys, env: _Envelope) -> list[RowTuple]:
    """One row per transition; the error goes on the last FAILED one (else the last)."""
    attempt = _attempt(p, k["task_attempt"])
    task_id = _hex(p, k["task_id"])
    job_id = _hex(p, k["job_id"])
    node_id = _hex(p, k["node_id"]) or env.node_hex
    worker_id = _hex(p, k["worker_id"])
    attrs = extra_attrs(p, k, LIFECYCLE_TAKEN)
    pid = p.get(k["worker_pid"])
    if pid:
        attrs["worker_pid"] = str(pid if type(pid) is int else to_int(pid, k["worker_pid"]))
    found = _transitions(p, k, env.eager) or [("", env.time())]
    error, error_attrs, at = _error(p, k, found)
    many = len(found) > 1
    event_hex, host, env_attrs = env.event_hex, env.host, env.attrs
    rows = []
    for index, (raw, time) in enumerate(found):
        failure = _NO_ERROR
        if index == at:
            failure = error
            row_attrs = {**attrs, "ray_state": raw, **error_attrs, **env_attrs} if raw \
                else {**attrs, **error_attrs, **env_attrs}
        else:
            row_attrs = {**attrs, "ray_state": raw, **env_attrs} if raw \
                else {**attrs, **env_attrs}
        rows.append((
            event_hex + _SUFFIXES[index] if many else event_hex, time, "task", "ray", None,
            _STATE[raw] if raw else None, task_id, attempt, None, job_id, None, node_id,
            worker_id, None, host, None, None, None, None, None, failure.get("error_type"),
            failure.get("error_message"), failure.get("stack_trace"), None, None, row_attrs))
    return rows


def _profile(p: dict[str, Any], k: Keys, env: _Envelope) -> list[RowTuple]:
    """One "ray_profile" row per timed entry (a worker's deserialize, execute, store
    steps of one attempt), as `entities.map_profile`; an event with no entries declines
    (the careful path keeps it whole)."""
    profile = p.get(k["profile_events"])
    if type(profile) is not dict:
        raise Declined("no profileEvents")
    entries = profile.get("events") or ()
    if not entries:
        raise Declined("no profile entries")
    attempt = _attempt(p, k["attempt_number"])
    task_id, job_id = _hex(p, k["task_id"]), _hex(p, k["job_id"])
    worker_id = (_hex(profile, k["component_id"])
                 if profile.get(k["component_type"]) == "worker" else None)
    shared = extra_attrs(profile, k, PROFILE_TAKEN)
    many = len(entries) > 1
    rows = []
    for index, entry in enumerate(entries):
        name = entry.get(k["event_name"]) or None
        if name is not None and type(name) is not str:
            raise Declined("eventName is not a string")
        start = _int64(entry.get(k["start_time"], 0), k["start_time"])
        end = _int64(entry.get(k["end_time"], 0), k["end_time"])
        attrs = {**shared, **extra_attrs(entry, k, PROFILE_ENTRY_TAKEN), **env.attrs}
        rows.append((
            env.event_hex + _suffix(index) if many else env.event_hex,
            _checked(start) if start else env.time(), PROFILE_KIND, "ray", name, None,
            task_id, attempt, None, job_id, None, env.node_hex, worker_id, None, env.host,
            None, None, None, None, (end - start) / 1e9 if end >= start > 0 else None,
            None, None, None, None, None, attrs))
    return rows


def _suffix(index: int) -> str:
    """A row's event_id suffix. A driver's profile event holds an entry per task it
    submitted: hundreds, not the few transitions of a lifecycle event."""
    return _SUFFIXES[index] if index < len(_SUFFIXES) else f"-{index}"


def _transitions(p: dict[str, Any], k: Keys, eager: bool) -> list[tuple[str, Time]]:
    """(Ray's state, time) in order; [] when there are none."""
    listed = p.get(k["state_transitions"])
    if type(listed) is not list:  # 2.49-2.50: the `taskState` map, sorted by time
        return [(raw, _checked(ns)) for raw, ns in transitions(p, k)]
    found: list[tuple[str, Time]] = []
    for t in listed:
        state, text = t["state"], t["timestamp"]  # not there, or not a dict: declined
        if type(state) is not str or not state or type(text) is not str or len(t) != 2:
            raise Declined("odd transition")  # more fields: the careful path keeps them
        found.append((state, _checked(time_ns(text, "stateTransitions")) if eager else text))
    return found


def _error(p: dict[str, Any], k: Keys, found: list[tuple[str, Time]],
           ) -> tuple[dict[str, Any], dict[str, str], int]:
    """The error columns, their attrs and the index of the row that takes them (-1: none)."""
    info = p.get(k["ray_error_info"])
    if not isinstance(info, dict) or not info:
        return _NO_ERROR, _NO_ERROR, -1
    failed = [i for i, (raw, _) in enumerate(found) if raw == "FAILED"]
    error = error_columns(info.get(k["error_type"]), info.get(k["error_message"]))
    extra = extra_attrs(info, k, ERROR_TAKEN)
    attrs = {"ray_error_" + key[4:]: v for key, v in extra.items()}
    attrs.update(error.pop("attrs", {}))
    return error, attrs, failed[-1] if failed else len(found) - 1


class _States(dict[str, str]):
    """Ray's task state -> ours, learning states Ray adds later."""

    def __missing__(self, raw: str) -> str:
        state = STATE_OF.get(raw) or task_state(raw)
        if len(self) < 1024 and len(raw) <= MAX_CACHED_KEY:  # states come from outside
            self[raw] = state
        return state


Mapper = Callable[[dict[str, Any], Keys, _Envelope], list[RowTuple]]
_STATE: Final = _States(STATE_OF)
_SUFFIXES: Final = [f"-{i}" for i in range(64)]  # beyond that, the IndexError declines
_NO_ERROR: Final[dict[str, Any]] = {}
# event type -> (its mapper, its payload's key in camelCase and in snake_case)
_MAPPERS: Final[dict[str, tuple[Mapper, str, str]]] = {
    event_type: (mapper, K_CAMEL[payload], payload)
    for event_type, mapper, payload in (
        ("TASK_DEFINITION_EVENT", _definition, "task_definition_event"),
        ("ACTOR_TASK_DEFINITION_EVENT", _definition, "actor_task_definition_event"),
        ("TASK_LIFECYCLE_EVENT", _lifecycle, "task_lifecycle_event"),
        ("TASK_EXECUTION_EVENT", _lifecycle, "task_execution_event"),
        ("TASK_PROFILE_EVENT", _profile, PROFILE_PAYLOAD))
}
