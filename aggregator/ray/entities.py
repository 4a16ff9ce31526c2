"""Ray's actor, driver-job, node and worker events and task profile events -> row bodies.

Definitions become one row with state DEFINED (name, class, entrypoint, pid...);
lifecycle events one row per state transition with Ray's state as is (ALIVE, DEAD,
CREATED, ...) and death causes in the error columns. Row bodies lack the envelope
(event_id, source, attrs of the envelope), which `events.py` adds.
"""

from __future__ import annotations

from typing import Any

from aggregator.ray.errors import death_columns
from aggregator.ray.task_shapes import PROFILE_ENTRY_TAKEN, PROFILE_TAKEN
from aggregator.ray.values import (
    Keys,
    Taken,
    b64_hex,
    extra_attrs,
    ids,
    runtime_env,
    text,
    time_ns,
    to_int,
)

Row = dict[str, Any]

# event type -> (kind, payload fields that name it, id columns)
DEFINITIONS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ACTOR_DEFINITION_EVENT": ("actor", ("name", "class_name"), ("actor_id", "job_id")),
    "DRIVER_JOB_DEFINITION_EVENT": ("job", ("entrypoint",), ("job_id",)),
    "NODE_DEFINITION_EVENT": ("node", ("node_name", "hostname"), ("node_id",)),
    "WORKER_DEFINITION_EVENT": ("worker", (), ("worker_id", "node_id")),
}
# event type -> (kind, id column)
PROFILE_KIND = "ray_profile"  # a task's timed entry (TASK_PROFILE_EVENT)
UNMAPPED_KIND = "ray"  # an event type evagg does not map, kept whole in attrs['ray_raw']
# every kind Ray's events become (docs/ray.md)
RAY_KINDS = tuple(sorted({kind for kind, _, _ in DEFINITIONS.values()}
                         | {PROFILE_KIND, UNMAPPED_KIND}))

LIFECYCLES: dict[str, tuple[str, str]] = {
    "ACTOR_LIFECYCLE_EVENT": ("actor", "actor_id"),
    "DRIVER_JOB_LIFECYCLE_EVENT": ("job", "job_id"),
    "NODE_LIFECYCLE_EVENT": ("node", "node_id"),
    "WORKER_LIFECYCLE_EVENT": ("worker", "worker_id"),
}
_DEFINITION_TAKEN = {
    event_type: Taken(*id_columns, *name_fields[:1], "pid", "driver_pid", "driver_node_id",
                      "parent_id", "config", "serialized_runtime_env")
    for event_type, (_, name_fields, id_columns) in DEFINITIONS.items()
}
_TRANSITION_TAKEN = Taken("state", "timestamp", "node_id", "worker_id", "pid", "death_cause",
                     "death_info", "restart_reason", "alive_sub_state")


def map_definition(p: dict[str, Any], k: Keys, event_type: str) -> list[Row]:
    kind, name_fields, id_columns = DEFINITIONS[event_type]
    attrs = extra_attrs(p, k, _DEFINITION_TAKEN[event_type])
    config: dict[str, Any] = p["config"] if isinstance(p.get("config"), dict) else {}
    env = runtime_env(p.get(k["serialized_runtime_env"]) or config.get(k["serialized_runtime_env"]))
    if env:
        attrs["ray_runtime_env"] = env
    if config.get("metadata"):
        attrs["ray_job_metadata"] = text(config["metadata"])
    if p.get("pid"):
        attrs["worker_pid"] = str(to_int(p["pid"], "pid"))
    if p.get(k["driver_pid"]):
        attrs["ray_driver_pid"] = str(to_int(p[k["driver_pid"]], k["driver_pid"]))
    row: Row = {
        "kind": kind,
        "state": "DEFINED",
        **ids(p, k, *id_columns),
        "name": next((str(p[k[n]]) for n in name_fields if p.get(k[n])), None),
        "parent_id": b64_hex(p.get(k["parent_id"]), k["parent_id"]),
        "attrs": attrs,
    }
    if p.get(k["driver_node_id"]):
        row["node_id"] = b64_hex(p[k["driver_node_id"]], k["driver_node_id"])
    return [row]


def map_lifecycle(p: dict[str, Any], k: Keys, event_type: str) -> list[Row]:
    kind, id_column = LIFECYCLES[event_type]
    common = {"kind": kind, **ids(p, k, id_column, "job_id")}
    rows = []
    for t in p.get(k["state_transitions"]) or []:
        if not isinstance(t, dict):
            continue
        attrs = _transition_attrs(t, k)
        row: Row = {**common, "state": str(t.get("state") or "") or None,
                    "time": time_ns(t.get("timestamp"), "timestamp"), "attrs": attrs}
        for column in ("node_id", "worker_id"):
            if t.get(k[column]):
                row[column] = b64_hex(t[k[column]], k[column])
        death = death_columns(t.get(k["death_cause"]) or t.get(k["death_info"]), "ray_death")
        attrs.update(death.pop("attrs", {}))
        row.update(death)
        rows.append(row)
    return rows


def _transition_attrs(t: dict[str, Any], k: Keys) -> dict[str, str]:
    attrs = extra_attrs(t, k, _TRANSITION_TAKEN)
    if t.get("pid"):
        attrs["worker_pid"] = str(to_int(t["pid"], "pid"))
    # Enums print their 0 value (ACTOR_FAILURE, UNSPECIFIED) on every transition.
    if t.get("state") == "RESTARTING" and t.get(k["restart_reason"]):
        attrs["ray_restart_reason"] = str(t[k["restart_reason"]])
    if t.get(k["alive_sub_state"]) not in (None, "", "UNSPECIFIED"):
        attrs["ray_alive_sub_state"] = str(t[k["alive_sub_state"]])
    return attrs


def map_profile(p: dict[str, Any], k: Keys, event_type: str) -> list[Row]:
    """TASK_PROFILE_EVENT -> one kind "ray_profile" row per timed entry."""
    profile = p.get(k["profile_events"])
    if not isinstance(profile, dict):
        return []
    common: Row = {
        "kind": PROFILE_KIND,
        "attempt": to_int(p.get(k["attempt_number"], 0), k["attempt_number"]),
        **ids(p, k, "task_id", "job_id"),
    }
    if profile.get(k["component_type"]) == "worker":
        common["worker_id"] = b64_hex(profile.get(k["component_id"]), k["component_id"])
    attrs = extra_attrs(profile, k, PROFILE_TAKEN)
    rows = []
    for entry in profile.get("events") or []:
        start = to_int(entry.get(k["start_time"], 0), k["start_time"])
        end = to_int(entry.get(k["end_time"], 0), k["end_time"])
        extra = extra_attrs(entry, k, PROFILE_ENTRY_TAKEN)
        rows.append({**common, "name": entry.get(k["event_name"]) or None,
                     "time": start or None,
                     "duration_s": (end - start) / 1e9 if end >= start > 0 else None,
                     "attrs": {**attrs, **extra}})
    return rows
