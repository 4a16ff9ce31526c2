"""The columns of Ray's State API resources, as `ray.util.state.common` declares them.

Ray (2.60) marks each dataclass field as a base or a detail column and says which can be
filtered; the State API server returns exactly the base columns, or every column with
`detail=1`, in this order, and refuses a filter on any other column. Copied here because
the dashboard must not need Ray installed; tests/dashboard/raystate checks this copy
against Ray's own dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Ray's error type for a task's own exception: its worker lived to report it (every other
# type is a death, a cancel or a dependency's loss, which Ray's owner reports).
APPLICATION_ERROR = "TASK_EXECUTION_EXCEPTION"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    detail: bool = False
    filterable: bool = False
    kind: str = "str"  # str, int, float or bool: how a filter value is read


def _c(name: str, flags: str = "", kind: str = "str") -> Column:
    """flags: "f" filterable, "d" detail."""
    return Column(name, detail="d" in flags, filterable="f" in flags, kind=kind)


TASK = (
    _c("task_id", "f"), _c("attempt_number", "f", "int"), _c("name", "f"), _c("state", "f"),
    _c("job_id", "f"), _c("actor_id", "f"), _c("type", "f"), _c("func_or_class_name", "f"),
    _c("parent_task_id", "f"), _c("node_id", "f"), _c("worker_id", "f"),
    _c("worker_pid", "f", "int"), _c("error_type", "f"), _c("language", "df"),
    _c("required_resources", "d"), _c("runtime_env_info", "d"),
    _c("placement_group_id", "df"), _c("events", "d"), _c("profiling_data", "d"),
    _c("creation_time_ms", "d", "int"), _c("start_time_ms", "d", "int"),
    _c("end_time_ms", "d", "int"), _c("task_log_info", "d"), _c("error_message", "d"),
    _c("is_debugger_paused", "df", "bool"), _c("call_site", "d"), _c("label_selector", "d"),
    _c("fallback_strategy", "d"),
)
ACTOR = (
    _c("actor_id", "f"), _c("class_name", "f"), _c("state", "f"), _c("job_id", "f"),
    _c("name", "f"), _c("node_id", "f"), _c("pid", "f", "int"), _c("ray_namespace", "f"),
    _c("serialized_runtime_env", "d"), _c("required_resources", "d"), _c("death_cause", "d"),
    _c("is_detached", "d", "bool"), _c("placement_group_id", "df"), _c("repr_name", "df"),
    _c("num_restarts", "d", "int"), _c("num_restarts_due_to_lineage_reconstruction", "d", "int"),
    _c("num_restarts_due_to_node_preemption", "d", "int"), _c("call_site", "d"),
    _c("label_selector", "d"), _c("fallback_strategy", "d"),
)
NODE = (
    _c("node_id", "f"), _c("node_ip", "f"), _c("is_head_node", "f", "bool"), _c("state", "f"),
    _c("state_message"), _c("node_name", "f"), _c("resources_total"), _c("labels"),
    _c("start_time_ms", "d", "int"), _c("end_time_ms", "d", "int"),
)
WORKER = (
    _c("worker_id", "f"), _c("is_alive", "f", "bool"), _c("worker_type", "f"),
    _c("exit_type", "f"), _c("node_id", "f"), _c("ip", "f"), _c("pid", "f", "int"),
    _c("exit_detail", "d"), _c("worker_launch_time_ms", "d", "int"),
    _c("worker_launched_time_ms", "d", "int"), _c("start_time_ms", "d", "int"),
    _c("end_time_ms", "d", "int"), _c("debugger_port", "df", "int"),
    _c("num_paused_threads", "df", "int"),
)
PLACEMENT_GROUP = (
    _c("placement_group_id", "f"), _c("name", "f"), _c("creator_job_id", "f"), _c("state", "f"),
    _c("bundles", "d"), _c("is_detached", "df", "bool"), _c("stats", "d"),
    _c("topology_strategy", "d"), _c("topology_assignments", "d"),
)
# JobState is pydantic's JobDetails: every field in detail, these without.
_JOB_BASE = ("job_id", "submission_id", "entrypoint", "type", "status", "message", "error_type",
             "driver_info")
_JOB_DETAIL_ONLY = ("start_time", "end_time", "metadata", "runtime_env",
                    "driver_agent_http_address", "driver_node_id", "driver_exit_code")
_JOB_FILTERABLE = ("job_id", "type", "status", "submission_id")
JOB = tuple(
    Column(name, detail=name in _JOB_DETAIL_ONLY, filterable=name in _JOB_FILTERABLE,
           kind="int" if name in ("start_time", "end_time", "driver_exit_code") else "str")
    for name in ("type", "job_id", "submission_id", "driver_info", "status", "entrypoint",
                 "message", "error_type", "start_time", "end_time", "metadata", "runtime_env",
                 "driver_agent_http_address", "driver_node_id", "driver_exit_code"))
# Ray lists a job's base columns in this order, not in the model's.
JOB_BASE_ORDER = _JOB_BASE

SCHEMAS: dict[str, tuple[Column, ...]] = {
    "tasks": TASK, "actors": ACTOR, "nodes": NODE, "workers": WORKER, "jobs": JOB,
    "placement_groups": PLACEMENT_GROUP,
}


def columns(resource: str, detail: bool) -> list[str]:
    """The columns Ray returns for `resource`, in Ray's order."""
    if resource == "jobs" and not detail:
        return list(JOB_BASE_ORDER)
    return [c.name for c in SCHEMAS[resource] if detail or not c.detail]


def filterable(resource: str) -> dict[str, Column]:
    return {c.name: c for c in SCHEMAS[resource] if c.filterable}


def shape(resource: str, row: dict[str, Any], detail: bool) -> dict[str, Any]:
    """`row` cut to Ray's columns (ray.util.state.common.filter_fields): missing ones None."""
    return {name: row.get(name) for name in columns(resource, detail)}
