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

from dashboard.lake.store import Store
from dashboard.raystate.options import Filter, ListOptions, list_response, matches
from dashboard.raystate.rows import (
    RAY_STATE_OF,
    camel_to_snake,
    func_or_class_name,
    json_or,
    ms_floor,
)
from dashboard.raystate.schema import APPLICATION_ERROR, shape
from dashboard.raystate.sessions import only_tasks_of

# ray.rpc.TaskStatus in enum order: Ray lists a task's events in this order and calls
# the last one its state.
TASK_STATUS = (
    "NIL", "PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH", "SUBMITTED_TO_WORKER", "PENDING_ACTOR_TASK_ARGS_FETCH",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "RUNNING", "RUNNING_IN_RAY_GET",
    "RUNNING_IN_RAY_WAIT", "FINISHED", "FAILED", "GETTING_AND_PINNING_ARGS",
)
_RANK = {name: i for i, name in enumerate(TASK_STATUS)}
# Ray's columns as SQL over the `tasks` view. Ray's func_or_class_name is the
# descriptor's call string: the function, or Class.method for actors, without the
# module; the view keeps module.Class.function.
STATE_SQL = ("CASE final_state " + " ".join(f"WHEN '{ours}' THEN '{ray}'"
                                            for ours, ray in RAY_STATE_OF.items())
             + " ELSE final_state END")
COLUMN_SQL = {
    "task_id": "task_id",
    "attempt_number": "attempt",
    "name": "coalesce(name, '')",
    "state": STATE_SQL,
    "job_id": "job_id",
    # an actor creation task's id is ffffffffffffffff + its actor's id
    "actor_id": "coalesce(nullif(actor_id, ''), CASE WHEN task_type = 'ACTOR_CREATION_TASK' "
                "THEN substr(task_id, 17) END)",
    "type": "coalesce(task_type, 'NORMAL_TASK')",
    "func_or_class_name": "CASE WHEN task_type IN ('ACTOR_TASK', 'ACTOR_CREATION_TASK') "
                          "THEN array_to_string(list_slice(string_split(function, '.'), -2, -1), "
                          "'.') ELSE coalesce(string_split(function, '.')[-1], name, '') END",
    "parent_task_id": "parent_id",
    "node_id": "nullif(node_id, '')",
    "worker_id": "nullif(worker_id, '')",
    "worker_pid": "pid",
    "error_type": "error_type",
}
SESSION_TASKS = "FROM tasks WHERE source = 'ray' AND coalesce(ray_session, '') = $session"
# Filtering on task_type in SQL makes DuckDB carry it through every scan of the view
# (3-4x slower over a million tasks): drivers are counted by a GROUP BY and left out
# of the few rows fetched instead.
IS_DRIVER = "coalesce(task_type, '') = 'DRIVER_TASK'"


def session_tasks(store: Store, session: str) -> str:
    """FROM and WHERE for the session's tasks."""
    if only_tasks_of(store, session):
        return "FROM tasks WHERE ($session = $session)"
    return SESSION_TASKS


def where(filters: tuple[Filter, ...], params: dict[str, Any]) -> str:
    """Ray's do_filter as SQL: strings compare without case, NULL is never equal and
    always unequal. Detail-only columns are not in the view (Ray lets language,
    placement_group_id and is_debugger_paused be filtered): those filter the page."""
    clauses = []
    for i, f in enumerate(filters):
        column = COLUMN_SQL.get(f.column.name)
        if column is None:
            continue
        param = f"f{i}"
        params[param] = f.value
        if isinstance(f.value, str):
            equal = f"lower({column}) = lower(${param})"
        else:
            equal = f"{column} = ${param}"
        clauses.append(equal if f.predicate == "=" else f"(({column}) IS NULL OR NOT ({equal}))")
    return " AND ".join(f"({c})" for c in clauses) or "true"


def list_tasks(store: Store, session: str, options: ListOptions) -> dict[str, Any]:
    params: dict[str, Any] = {"session": session}
    flt = where(options.filters, params)
    scope = session_tasks(store, session)
    counts = {bool(driver): (int(n), int(kept)) for driver, n, kept in store.execute(
        f"SELECT {IS_DRIVER}, count(*), count(*) FILTER (WHERE {flt}) {scope} GROUP BY 1",
        params, views=False).rows}
    tasks, drivers = counts.get(False, (0, 0)), counts.get(True, (0, 0))
    total, filtered = tasks if options.exclude_driver else (tasks[0] + drivers[0],
                                                              tasks[1] + drivers[1])
    skip = drivers[1] if options.exclude_driver else 0
    page = _page(store, scope, flt, params, options.limit, skip, options.exclude_driver)
    later = [f for f in options.filters if f.column.name not in COLUMN_SQL]
    if options.detail or later or any(r["state"] not in ("FINISHED", "FAILED", "RUNNING")
                                       or r["inferred"] for r in page):
        page = _with_raw_details(store, session, page, detail=options.detail or bool(later))
    if later:
        page = [r for r in page if matches(r, tuple(later))]
    rows = [shape("tasks", r, options.detail) for r in page]
    return list_response(rows, total=total, filtered=filtered)


def _page(store: Store, scope: str, flt: str, params: dict[str, Any], limit: int, skip: int,
          exclude_driver: bool) -> list[dict[str, Any]]:
    """The first `limit` rows in Ray's order (task id). The sort carries two columns over
    every task (carrying Ray's thirteen through it took seconds); the last key it finds,
    `skip` (the drivers it may hold) past the limit, bounds a range scan for the rows."""
    if limit == 0:
        return []
    keys = store.execute(f"SELECT task_id {scope} AND {flt} ORDER BY task_id LIMIT $n",
                         {**params, "n": limit + skip}, views=False).rows
    if not keys:
        return []
    selected = ", ".join(f"{sql} AS {name}" for name, sql in COLUMN_SQL.items())
    selected += (", epoch_us(first_seen) AS first_us, epoch_us(last_seen) AS last_us, "
                 "epoch_us(coalesce(finished_at, failed_at)) AS end_us, inferred, "
                 "error_message AS view_error_message")
    driver = f"AND NOT {IS_DRIVER}" if exclude_driver else ""
    return store.execute(
        f"SELECT {selected} {scope} AND {flt} AND task_id BETWEEN $first AND $last {driver} "
        "ORDER BY task_id, attempt LIMIT $limit",
        {**params, "first": keys[0][0], "last": keys[-1][0], "limit": limit},
        views=False).records()


def summarize_tasks(store: Store, session: str, options: ListOptions) -> dict[str, Any]:
    """Ray's TaskSummaries.to_summary_by_func_name over every task of the session:
    counted by the view's own columns, named as Ray names them per group."""
    params: dict[str, Any] = {"session": session}
    flt = where(options.filters, params)
    scope = session_tasks(store, session)
    groups = store.execute(
        f"SELECT name, function, task_type, final_state, count(*) FILTER (WHERE {flt}) AS n, "
        f"count(*) AS every, min(task_id) FILTER (WHERE {flt}) AS first {scope} GROUP BY ALL",
        params, views=False).records()
    first: dict[str, tuple[str, str]] = {}  # Ray types a group after its first task
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    totals = {"NORMAL_TASK": 0, "ACTOR_TASK": 0, "ACTOR_CREATION_TASK": 0}
    total = 0
    for g in groups:
        task_type = g["task_type"] or "NORMAL_TASK"
        if task_type == "DRIVER_TASK":
            continue
        total += int(g["every"])
        if not g["n"]:
            continue
        key = g["name"] or func_or_class_name(g["function"], task_type) or ""
        if key not in first or g["first"] < first[key][0]:
            first[key] = (g["first"], task_type)
        counts[key][RAY_STATE_OF.get(g["final_state"], g["final_state"])] += int(g["n"])
        if task_type in totals:
            totals[task_type] += int(g["n"])
    summary = {key: {"func_or_class_name": key, "type": first[key][1],
                     "state_counts": dict(counts[key])} for key in sorted(counts)}
    result = {"summary": summary, "total_tasks": totals["NORMAL_TASK"],
              "total_actor_tasks": totals["ACTOR_TASK"],
              "total_actor_scheduled": totals["ACTOR_CREATION_TASK"], "summary_by": "func_name"}
    filtered = sum(sum(c.values()) for c in counts.values())
    return {"total": total, "num_after_truncation": total,
            "num_filtered": filtered, "result": {"node_id_to_summary": {"cluster": result}},
            "partial_failure_warning": "", "warnings": None}


# -- what the view does not keep: read from the page's raw task events ------------------

RAW = """
SELECT task_id, coalesce(attempt, 0) AS attempt, kind, name, attrs['ray_state'] AS ray_state,
       epoch_us(time) AS us, duration_s, worker_id, attrs, error_type, error_message, stack_trace
FROM events_raw
WHERE kind IN ('task', 'ray_profile') AND source = 'ray'
  AND task_id IN (SELECT unnest($ids)) AND coalesce(attrs['ray_session'], '') = $session
  AND time BETWEEN to_timestamp($from_us / 1e6) AND to_timestamp($to_us / 1e6)
"""
# The page's raw events lie between its tasks' first and last events; a margin keeps
# profile entries timed by another clock. The bound lets Parquet skip the rest.
MARGIN_US = 60_000_000


def _with_raw_details(store: Store, session: str, page: list[dict[str, Any]], *,
                      detail: bool) -> list[dict[str, Any]]:
    ids = sorted({r["task_id"] for r in page})
    if not ids:
        return page
    times = [t for r in page for t in (r.get("first_us"), r.get("last_us")) if t is not None]
    if not times:
        return page
    raw = store.execute(RAW, {"ids": ids, "session": session,
                              "from_us": min(times) - MARGIN_US,
                              "to_us": max(times) + MARGIN_US}).records()
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
        # Ray's task table prints this message's default as {"options": []}; the
        # export leaves a default out.
        "fallback_strategy": json_or(attrs.get("ray_fallback_strategy"), {"options": []}),
    }
    if transitions:
        out["state"] = transitions[-1]["state"]
    if row.get("inferred"):
        _put_inferred_end(row, out)
    return out


def _put_inferred_end(row: dict[str, Any], out: dict[str, Any]) -> None:
    """An end evagg inferred (dashboard/sql/ends.sql) has no Ray event of its own: it
    becomes the last transition, and its error message says how evagg knows."""
    end_ms = _ms(row.get("end_us"))
    if end_ms is not None and row["state"] in ("FAILED", "FINISHED"):
        out["events"] = [*out["events"], {"state": row["state"], "created_ms": float(end_ms)}]
        out["end_time_ms"] = end_ms
        out["state"] = row["state"]
    message = row.get("view_error_message") or out.get("error_message") or ""
    out["error_message"] = f"{message} ({row['inferred']})".strip()


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
    banner = "User exception:\n" if last["error_type"] == APPLICATION_ERROR else ""
    return f"{banner}{stack}\n{message}"
