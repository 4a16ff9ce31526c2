"""Ray Event Export payloads (JSON arrays of RayEvent) -> evagg event rows: the careful path.

Pure mapping, no HTTP. This is the reference mapping of every Ray event to row dicts
(which `aggregator.decode.normalize` then checks). The /ray/events route (`batch.py`) sends
task definition and lifecycle events through `fast.py` instead, which gives the same
rows straight as Arrow columns, and sends everything else here: the other event types,
and any task event of a shape the fast path is not sure of.

Handled: camelCase and snake_case keys; Ray >= 2.51 TASK_LIFECYCLE_EVENT
(`stateTransitions`) and 2.49-2.50 TASK_EXECUTION_EVENT (`taskState` map), one row per
state transition, states mapped to PENDING/SUBMITTED/RUNNING/FINISHED/FAILED with
Ray's own in attrs["ray_state"]; task and actor-task definitions as rows with state
DEFINED (they alone carry the task's name); actor, driver-job, node, worker and profile
events (`entities.py`). Any other event type becomes one kind "ray" row holding the
whole object in attrs["ray_raw"]; nothing is rejected for being new to us. Fields no
column takes go to attrs["ray_<snake_name>"] unless at their default value. An event
that yields several rows gives them the ids "<eventId hex>-<i>", so a resend maps to
the same ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from aggregator.ray.dedupe import RecentEventIds, content_id, ray_event_id
from aggregator.ray.entities import (
    DEFINITIONS,
    LIFECYCLES,
    UNMAPPED_KIND,
    map_definition,
    map_lifecycle,
    map_profile,
)
from aggregator.ray.errors import error_columns
from aggregator.ray.task_shapes import (
    DEFINITION_TAKEN,
    ERROR_TAKEN,
    LIFECYCLE_TAKEN,
    PROFILE_PAYLOAD,
    STATE_OF,
    envelope_attrs,
    function_name,
    function_parts,
    task_state,
    transition_attrs,
    transitions,
)
from aggregator.ray.values import (
    Keys,
    RayValueError,
    b64_hex,
    creation_actor_id,
    extra_attrs,
    ids,
    keys_of,
    runtime_env,
    text,
    time_ns,
    to_int,
)

Row = dict[str, Any]
Mapper = Callable[[dict[str, Any], Keys, str], list[Row]]

__all__ = ["RayBodyError", "RayValueError", "RecentEventIds", "careful_rows", "map_event",
           "parse_ray_body", "ray_event_id", "ray_events_to_rows", "task_state"]


class RayBodyError(ValueError):
    """A POST body that is not a JSON array of objects; the message says why."""


def parse_ray_body(body: bytes) -> list[Any]:
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RayBodyError(f"body is not valid JSON: {exc}") from None
    if not isinstance(items, list):
        raise RayBodyError(f"body must be a JSON array of events, not {_json_type(items)}")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise RayBodyError(f"event {index} must be a JSON object, not {_json_type(item)}")
    return items


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(value), "null" if value is None else "a number")


def ray_events_to_rows(items: list[Any]) -> tuple[list[Row], list[tuple[int, str]]]:
    """Rows in the evagg columns, and (index, reason) for events that cannot be read."""
    rows: list[Row] = []
    rejected: list[tuple[int, str]] = []
    for index, item in enumerate(items):
        try:
            rows.extend(careful_rows(item))
        except RayValueError as exc:
            rejected.append((index, str(exc)))
    return rows, rejected


def careful_rows(item: Any) -> list[Row]:
    """`map_event`, with any field it cannot read as a RayValueError naming the event type."""
    try:
        return map_event(item)
    except RayValueError as exc:
        raise RayValueError(f"{event_type_of(item) or 'Ray event'}: {exc}") from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # a field of an unexpected shape: refuse this event alone, keep the batch
        reason = f"unexpected field shape ({type(exc).__name__}: {exc})"
        raise RayValueError(f"{event_type_of(item) or 'Ray event'}: {reason}"[:500]) from None


def event_type_of(item: Any) -> str:
    if not isinstance(item, dict):
        return ""
    return str(item.get("eventType") or item.get("event_type") or "")


def map_event(item: Any) -> list[Row]:
    if not isinstance(item, dict):
        raise RayValueError(f"an event must be a JSON object, not {_json_type(item)}")
    k = keys_of(item)
    event_type = event_type_of(item)
    payload_name = event_type.lower()
    if event_type == "TASK_PROFILE_EVENT":
        payload_name = PROFILE_PAYLOAD
    payload_key = k[payload_name]
    payload = item.get(payload_key)
    mapper = _MAPPERS.get(event_type)
    bodies = mapper(payload, k, event_type) if mapper and isinstance(payload, dict) else []
    if not bodies:  # a type we do not know, or nothing we could map: keep it whole
        raw = orjson.dumps(item, option=orjson.OPT_SORT_KEYS).decode()
        bodies = [{"kind": UNMAPPED_KIND, "name": event_type or None, "attrs": {"ray_raw": raw}}]
    return _stamp_envelope(item, k, event_type, payload_key, bodies)


def _stamp_envelope(item: dict[str, Any], k: Keys, event_type: str, payload_key: str,
                    bodies: list[Row]) -> list[Row]:
    """Add what every row of one Ray event shares: ids, source, time, emitting node, attrs."""
    raw_id = item.get(k["event_id"])
    envelope_ns: int | None = None
    node_hex = b64_hex(item.get(k["node_id"]), k["node_id"])  # the emitting node (Ray >= 2.56)
    attrs = envelope_attrs(item, k, event_type, payload_key)
    try:
        event_hex = b64_hex(raw_id, k["event_id"], cache=False) or content_id(item)
    except RayValueError:  # an id in another form: the event is kept, under a digest
        event_hex = content_id(item)
        attrs = {**attrs, "ray_event_id": text(raw_id)}
    many = len(bodies) > 1
    for index, body in enumerate(bodies):
        body["event_id"] = f"{event_hex}-{index}" if many else event_hex
        body["source"] = "ray"
        if body.get("time") is None:  # parsed only when a row has no time of its own
            if envelope_ns is None and item.get("timestamp"):
                envelope_ns = time_ns(item["timestamp"], "timestamp")
            body["time"] = envelope_ns
        if not body.get("node_id"):
            body["node_id"] = node_hex
        if "attrs" in body:  # each row has its own dict; the envelope's names win
            body["attrs"].update(attrs)
        else:
            body["attrs"] = attrs.copy()
    return bodies


def map_task_definition(p: dict[str, Any], k: Keys, event_type: str) -> list[Row]:
    function = function_name(function_parts(p, k))
    attrs = extra_attrs(p, k, DEFINITION_TAKEN)
    attrs.setdefault("ray_task_type", "ACTOR_TASK" if k["actor_func"] in p else "NORMAL_TASK")
    if function:
        attrs["ray_function"] = function
    placement = b64_hex(p.get(k["placement_group_id"]), k["placement_group_id"])
    if placement and placement.strip("f"):  # all 0xff is the nil id
        attrs["ray_placement_group_id"] = placement
    env = runtime_env(p.get(k["serialized_runtime_env"]))
    if env:
        attrs["ray_runtime_env"] = env
    found = ids(p, k, "task_id", "job_id", "actor_id")
    found["actor_id"] = found["actor_id"] or creation_actor_id(attrs["ray_task_type"],
                                                               found["task_id"])
    return [{
        "kind": "task",
        "state": "DEFINED",
        "name": p.get(k["task_name"]) or p.get(k["actor_task_name"]) or function,
        "attempt": to_int(p.get(k["task_attempt"], 0), k["task_attempt"]),
        **found,
        "parent_id": b64_hex(p.get(k["parent_task_id"]), k["parent_task_id"]),
        "attrs": attrs,
    }]


def map_task_lifecycle(p: dict[str, Any], k: Keys, event_type: str) -> list[Row]:
    """One row per transition. The owner's events carry the executor's node and worker and
    the error; the executor's RUNNING event carries the worker's pid and log files."""
    common = {"kind": "task", "attempt": to_int(p.get(k["task_attempt"], 0), k["task_attempt"]),
              **ids(p, k, "task_id", "job_id", "node_id", "worker_id")}
    attrs = extra_attrs(p, k, LIFECYCLE_TAKEN)
    if p.get(k["worker_pid"]):
        attrs["worker_pid"] = str(to_int(p[k["worker_pid"]], k["worker_pid"]))
    found = transitions(p, k)
    extras = transition_attrs(p, k) or [{}] * len(found)
    rows: list[Row] = [{**common, "state": STATE_OF.get(raw) or task_state(raw), "time": ns,
                        "attrs": {**attrs, **extra, "ray_state": raw}}
                       for (raw, ns), extra in zip(found, extras, strict=True)]
    if not rows:
        rows = [{**common, "attrs": attrs}]
    info = p.get(k["ray_error_info"])
    if isinstance(info, dict) and info:
        failed = [i for i, (raw, _) in enumerate(found) if raw == "FAILED"]
        row = rows[failed[-1] if failed else -1]
        error = error_columns(info.get(k["error_type"]), info.get(k["error_message"]))
        extra = extra_attrs(info, k, ERROR_TAKEN)
        row["attrs"].update({"ray_error_" + key[4:]: v for key, v in extra.items()})
        row["attrs"].update(error.pop("attrs", {}))
        row.update(error)
    return rows


_MAPPERS: dict[str, Mapper] = {
    "TASK_DEFINITION_EVENT": map_task_definition,
    "ACTOR_TASK_DEFINITION_EVENT": map_task_definition,
    "TASK_LIFECYCLE_EVENT": map_task_lifecycle,
    "TASK_EXECUTION_EVENT": map_task_lifecycle,
    "TASK_PROFILE_EVENT": map_profile,
    **dict.fromkeys(DEFINITIONS, map_definition),
    **dict.fromkeys(LIFECYCLES, map_lifecycle),
}
