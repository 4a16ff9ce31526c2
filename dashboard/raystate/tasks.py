"""Ray's `tasks` and `tasks/summarize` answered from the store's `tasks` view.

One row per task attempt of one Ray session, in `ray.util.state.common.TaskState`'s
columns. The list, its filters, counts and order (by task id, as Ray sorts) run in
DuckDB over the folded `tasks` view, so a million tasks cost a sort, not a million
Python dicts; only the returned page is read again from the raw task events, for
what the view does not keep: Ray's own state names (the view folds PENDING_* into
PENDING), the state transitions (`events`), the definition's details and the profile
events.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dashboard.raystate.options import Filter, ListOptions, list_response
from dashboard.raystate.rows import camel_to_snake, json_or, ms_floor
from dashboard.raystate.schema import shape
from dashboard.store import Store

# ray.rpc.TaskStatus in enum order: Ray lists a task's events in this order and calls
# the last one its state.
TASK_STATUS = (
    "NIL", "PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH", "SUBMITTED_TO_WORKER", "PENDING_ACTOR_TASK_ARGS_FETCH",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "RUNNING", "RUNNING_IN_RAY_GET",
    "RUNNING_IN_RAY_WAIT", "FINISHED", "FAILED", "GETTING_AND_PINNING_ARGS",
)
_RANK = {name: i for i, name in enumerate(TASK_STATUS)}
# Ray's func_or_class_name is the descriptor's call string: the function, or Class.method
# for actors, without the module; the view keeps module.Class.function.
RAY_TASKS = """
WITH rt AS (
    SELECT
        task_id,
        attempt AS attempt_number,
        coalesce(name, '') AS name,
        CASE final_state
            WHEN 'SUBMITTED' THEN 'SUBMITTED_TO_WORKER'
            WHEN 'PENDING' THEN 'PENDING_ARGS_AVAIL'
            WHEN 'DEFINED' THEN 'NIL'
            WHEN 'UNKNOWN' THEN 'NIL'
            ELSE final_state
        END AS state,
        job_id,
        -- an actor creation task's id is ffffffffffffffff + its actor's id
        coalesce(nullif(actor_id, ''), CASE WHEN task_type = 'ACTOR_CREATION_TASK'
                                            THEN substr(task_id, 17) END) AS actor_id,
        coalesce(task_type, 'NORMAL_TASK') AS type,
        CASE WHEN task_type IN ('ACTOR_TASK', 'ACTOR_CREATION_TASK')
             THEN array_to_string(list_slice(string_split(function, '.'), -2, -1), '.')
             ELSE coalesce(string_split(function, '.')[-1], name, '')
        END AS func_or_class_name,
        parent_id AS parent_task_id,
        nullif(node_id, '') AS node_id,
        nullif(worker_id, '') AS worker_id,
        pid AS worker_pid,
        error_type
    FROM tasks
    WHERE source = 'ray' AND coalesce(ray_session, '') = $session
)
"""
BASE = ("task_id", "attempt_number", "name", "state", "job_id", "actor_id", "type",
        "func_or_class_name", "parent_task_id", "node_id", "worker_id", "worker_pid",
        "error_type")
SQL_COLUMNS = set(BASE)


def where(filters: tuple[Filter, ...], exclude_driver: bool,
          params: dict[str, Any]) -> str:
    """Ray's do_filter as SQL over `rt`: strings compare without case, NULL is never
    equal and always unequal. Detail-only columns cannot be filtered in SQL (Ray lets
    language, placement_group_id and is_debugger_paused through): those filter the page."""
    clauses = ["type <> 'DRIVER_TASK'"] if exclude_driver else []
    for i, f in enumerate(filters):
        if f.column.name not in SQL_COLUMNS:
            continue
        name, param = f.column.name, f"f{i}"
        params[param] = f.value
        if isinstance(f.value, str):
            equal = f"lower({name}) = lower(${param})"
        else:
            equal = f"{name} = ${param}"
        clauses.append(equal if f.predicate == "=" else f"({name} IS NULL OR NOT ({equal}))")
    return " AND ".join(clauses) or "true"


def list_tasks(store: Store, session: str, options: ListOptions) -> dict[str, Any]:
    params: dict[str, Any] = {"session": session}
    base = where((), options.exclude_driver, params)
    flt = where(options.filters, options.exclude_driver, params)
    counted = store.execute(
        RAY_TASKS + f"SELECT count(*) FILTER (WHERE {base}) AS total, "
                    f"count(*) FILTER (WHERE {flt}) AS filtered FROM rt",
        params, views=False).rows[0]
    page_params = {**params, "limit": options.limit}
    page = store.execute(RAY_TASKS + f"SELECT {', '.join(BASE)} FROM rt WHERE {flt} "
                         "ORDER BY task_id, attempt_number LIMIT $limit",
                         page_params, views=False).records()
    later = [f for f in options.filters if f.column.name not in SQL_COLUMNS]
    if options.detail or later or any(r["state"] not in ("FINISHED", "FAILED", "RUNNING")
                                       for r in page):
        page = _with_raw_details(store, session, page, detail=options.detail or bool(later))
    if later:
        from dashboard.raystate.options import matches

        page = [r for r in page if matches(r, tuple(later))]
    rows = [shape("tasks", r, options.detail) for r in page]
    return list_response(rows, total=int(counted[0] or 0), filtered=int(counted[1] or 0))


def summarize_tasks(store: Store, session: str, options: ListOptions) -> dict[str, Any]:
    """Ray's TaskSummaries.to_summary_by_func_name over every task of the session."""
    params: dict[str, Any] = {"session": session}
    base = where((), True, params)
    flt = where(options.filters, True, params)
    rows = store.execute(
        RAY_TASKS + f"""SELECT coalesce(nullif(name, ''), func_or_class_name) AS key,
                            type, state, count(*) AS n, min(task_id) AS first_id
                     FROM rt WHERE {flt} GROUP BY ALL ORDER BY key, state""",
        params, views=False).rows
    total = store.execute(RAY_TASKS + f"SELECT count(*) FROM rt WHERE {base}", params,
                          views=False).rows[0][0]
    # Ray names a group's type after its first task in task id order.
    first: dict[str, tuple[str, str]] = {}
    for key, task_type, _state, _n, first_id in rows:
        if key not in first or first_id < first[key][0]:
            first[key] = (first_id, task_type)
    summary: dict[str, dict[str, Any]] = {}
    totals = {"NORMAL_TASK": 0, "ACTOR_TASK": 0, "ACTOR_CREATION_TASK": 0}
    filtered = 0
    for key, task_type, state, n, _first_id in rows:
        entry = summary.setdefault(key, {"func_or_class_name": key, "type": first[key][1],
                                         "state_counts": {}})
        entry["state_counts"][state] = entry["state_counts"].get(state, 0) + int(n)
        if task_type in totals:
            totals[task_type] += int(n)
        filtered += int(n)
    result = {"summary": summary, "total_tasks": totals["NORMAL_TASK"],
              "total_actor_tasks": totals["ACTOR_TASK"],
              "total_actor_scheduled": totals["ACTOR_CREATION_TASK"], "summary_by": "func_name"}
    return {"total": int(total or 0), "num_after_truncation": int(total or 0),
            "num_filtered": filtered, "result": {"node_id_to_summary": {"cluster": result}},
            "partial_failure_warning": "", "warnings": None}


# -- what the view does not keep: read from the page's raw task events ------------------

RAW = """
SELECT task_id, coalesce(attempt, 0) AS attempt, kind, name, attrs['ray_state'] AS ray_state,
       epoch_us(time) AS us, duration_s, worker_id, attrs, error_type, error_message, stack_trace
FROM events_raw
WHERE kind IN ('task', 'ray_profile') AND source = 'ray'
  AND task_id IN (SELECT unnest($ids)) AND coalesce(attrs['ray_session'], '') = $session
"""


def _with_raw_details(store: Store, session: str, page: list[dict[str, Any]], *,
                      detail: bool) -> list[dict[str, Any]]:
    ids = sorted({r["task_id"] for r in page})
    if not ids:
        return page
    raw = store.execute(RAW, {"ids": ids, "session": session}).records()
    by_attempt: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for event in raw:
        by_attempt[(event["task_id"], event["attempt"])].append(event)
    out = []
    for row in page:
        events = by_attempt.get((row["task_id"], row["attempt_number"]), [])
        extra = _details(row, events)
        row = {**row, "state": extra.pop("state", row["state"])}
        out.append({**row, **extra} if detail else row)
    return out


def _details(row: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    first: dict[str, int] = {}
    attrs: dict[str, str] = {}
    profile: list[dict[str, Any]] = []
    log_info: dict[str, Any] = {}  # the executor sends the starts, the owner the ends
    for e in sorted(events, key=lambda e: e["us"] or 0):
        if e["kind"] == "ray_profile":
            profile.append(e)
            continue
        for key, value in (e["attrs"] or {}).items():
            attrs.setdefault(key, value)
        found = json_or((e["attrs"] or {}).get("ray_task_log_info"), None)
        if isinstance(found, dict):
            log_info.update(found)
        state = e["ray_state"]
        if state in _RANK and e["us"] is not None:
            first.setdefault(state, e["us"])
    transitions = [{"state": s, "created_ms": float(ms_floor(first[s]))}
                   for s in TASK_STATUS if s in first]
    out: dict[str, Any] = {
        "language": attrs.get("ray_language"),
        "required_resources": json_or(attrs.get("ray_required_resources"), {}),
        "runtime_env_info": {"serialized_runtime_env": attrs.get("ray_runtime_env", "{}")},
        "placement_group_id": attrs.get("ray_placement_group_id"),
        "events": transitions,
        "profiling_data": _profiling_data(profile),
        "creation_time_ms": _ms(first.get("PENDING_ARGS_AVAIL")),
        "start_time_ms": _ms(first.get("RUNNING")),
        "end_time_ms": _ms(first.get("FINISHED", first.get("FAILED"))),
        "task_log_info": _log_info(log_info),
        "error_message": _error_text(row, events),
        "is_debugger_paused": None,
        "call_site": attrs.get("ray_call_site"),
        "label_selector": json_or(attrs.get("ray_label_selector"), {}),
        "fallback_strategy": json_or(attrs.get("ray_fallback_strategy"), None),
    }
    if transitions:
        out["state"] = transitions[-1]["state"]
    return out


def _ms(us: int | None) -> int | None:
    return None if us is None else ms_floor(us)


def _profiling_data(profile: list[dict[str, Any]]) -> dict[str, Any]:
    if not profile:
        return {}
    attrs = profile[0]["attrs"] or {}
    events = []
    for e in profile:
        start_ms = e["us"] / 1000
        end_ms = start_ms + (e["duration_s"] or 0) * 1000
        events.append({"start_time": start_ms, "end_time": end_ms,
                       "extra_data": json_or((e["attrs"] or {}).get("ray_extra_data"), {}),
                       "event_name": e["name"]})
    return {"component_type": attrs.get("ray_component_type", "worker"),
            "component_id": next((e["worker_id"] for e in profile if e["worker_id"]), None),
            "node_ip_address": attrs.get("ray_node_ip_address"), "events": events}


def _log_info(info: dict[str, Any]) -> dict[str, Any] | None:
    if not info:
        return None
    out: dict[str, Any] = camel_to_snake(info)
    for key in ("stdout_start", "stdout_end", "stderr_start", "stderr_end"):
        if key in out:
            out[key] = int(out[key])
    return out


def _error_text(row: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    """Ray's error_message is the whole text; the store split it into the stack and the
    exception (and dropped Ray's "User exception:" banner, put back here)."""
    failed = [e for e in events if e["error_type"] or e["error_message"]]
    if not failed:
        return None
    last = max(failed, key=lambda e: e["us"] or 0)
    message, stack = last["error_message"] or "", last["stack_trace"]
    if not stack:
        return message
    banner = "User exception:\n" if last["error_type"] == "TASK_EXECUTION_EXCEPTION" else ""
    return f"{banner}{stack}\n{message}"
