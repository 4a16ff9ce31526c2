"""What both Ray paths agree on: which fields a mapping takes from each part of an event,
the attrs every row of one event shares, a task's function name, and Ray's task states
in ours. The careful path (`events`) and the fast path (`fast`) import these; neither
imports the other's internals, so the two can only differ where a test holds them equal.
"""

from __future__ import annotations

from typing import Any

from aggregator.ray.values import Keys, RayValueError, Taken, extra_attrs, time_ns, to_int

ENVELOPE_TAKEN = Taken("event_id", "source_type", "event_type", "timestamp", "severity",
                       "message", "session_name", "node_id")


def envelope_attrs(item: dict[str, Any], k: Keys, event_type: str,
                   payload_key: str) -> dict[str, str]:
    """The attrs every row of one Ray event shares (both paths call this)."""
    attrs = {"ray_event_type": event_type, **extra_attrs(item, k, ENVELOPE_TAKEN, payload_key)}
    session = item.get(k["session_name"])
    if session:
        attrs["ray_session"] = str(session)
    severity = item.get("severity")
    if severity not in (None, "", "INFO"):
        attrs["ray_severity"] = str(severity)
    return attrs


# A profile event's `profileEvents` and each of its timed entries: component_type and
# node_ip_address stay as attrs (ray_component_type, ray_node_ip_address).
PROFILE_TAKEN = Taken("events", "component_id")
PROFILE_ENTRY_TAKEN = Taken("event_name", "start_time", "end_time")
PROFILE_PAYLOAD = "task_profile_events"  # the payload's name is not the type's, lower-cased

DEFINITION_TAKEN = Taken("task_id", "task_attempt", "task_name", "actor_task_name", "job_id",
                     "actor_id", "parent_task_id", "task_func", "actor_func",
                     "serialized_runtime_env", "placement_group_id")


def function_parts(p: dict[str, Any], k: Keys) -> tuple[Any, Any, Any]:
    """(module, class, function) of a task definition's function descriptor."""
    func = p.get(k["task_func"]) or p.get(k["actor_func"]) or {}
    inner = next((v for v in func.values() if isinstance(v, dict)), {})
    return (inner.get(k["module_name"]), inner.get(k["class_name"]),
            inner.get(k["function_name"]))


def function_name(parts: tuple[Any, ...]) -> str | None:
    """"module.Class.function", leaving out the parts that are unset."""
    return ".".join(str(x) for x in parts if x) or None


TASK_STATUS = (  # ray.rpc.TaskStatus by number, for the 2.49-2.50 `taskState` map
    "NIL", "PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH", "SUBMITTED_TO_WORKER", "PENDING_ACTOR_TASK_ARGS_FETCH",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "RUNNING", "RUNNING_IN_RAY_GET",
    "RUNNING_IN_RAY_WAIT", "FINISHED", "FAILED", "GETTING_AND_PINNING_ARGS",
)
_OUR_STATE = {"SUBMITTED_TO_WORKER": "SUBMITTED", "GETTING_AND_PINNING_ARGS": "SUBMITTED",
              "NIL": "PENDING"}


def task_state(raw: str) -> str:
    """Ray's TaskStatus -> PENDING, SUBMITTED, RUNNING, FINISHED or FAILED (others as is)."""
    if raw.startswith("PENDING"):
        return "PENDING"
    if raw.startswith("RUNNING"):
        return "RUNNING"
    return _OUR_STATE.get(raw, raw)


STATE_OF = {raw: task_state(raw) for raw in TASK_STATUS}


def transitions(p: dict[str, Any], k: Keys) -> list[tuple[str, int]]:
    """(Ray's state, time) of each transition, in order (the extras: `transition_attrs`)."""
    listed = p.get(k["state_transitions"])
    if isinstance(listed, list):
        return [(str(t.get("state") or "NIL"), time_ns(t.get("timestamp"), "stateTransitions"))
                for t in listed if isinstance(t, dict)]
    by_number = p.get(k["task_state"]) or {}  # 2.49-2.50: {"<TaskStatus number>": timestamp}
    if not isinstance(by_number, dict):
        raise RayValueError(f"{k['task_state']} must be an object")
    found = []
    for number, stamp in by_number.items():
        code = to_int(number, k["task_state"])
        name = TASK_STATUS[code] if 0 <= code < len(TASK_STATUS) else f"STATUS_{code}"
        found.append((time_ns(stamp, k["task_state"]), code, name))
    return [(name, ns) for ns, _, name in sorted(found)]


def transition_attrs(p: dict[str, Any], k: Keys) -> list[dict[str, str]]:
    """attrs["ray_<snake>"] of each listed transition's fields besides state and time (none
    today; kept as Ray adds them), in the order `transitions` gives them."""
    listed = p.get(k["state_transitions"])
    if not isinstance(listed, list):
        return []
    return [extra_attrs(t, k, TRANSITION_TAKEN) for t in listed if isinstance(t, dict)]


TRANSITION_TAKEN = Taken("state", "timestamp")
LIFECYCLE_TAKEN = Taken("task_id", "task_attempt", "state_transitions", "task_state",
                    "ray_error_info", "node_id", "worker_id", "worker_pid", "job_id")


ERROR_TAKEN = Taken("error_type", "error_message")
