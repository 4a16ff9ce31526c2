"""The questions the CLI and the dashboard ask, as parameterized SQL over the views."""

from __future__ import annotations

from typing import Any

from dashboard.lake.errors import BadInput, NotFound
from dashboard.lake.results import Result
from dashboard.lake.store import Store
from dashboard.questions.filters import TASK_TIME, TaskFilter, bounded_int, clean_text, task_order

DIMENSIONS = {  # dimension -> summary view
    "state": "summary_by_state",
    "name": "summary_by_name",
    "error_type": "summary_by_error",
    "job": "summary_by_job",
    "node": "summary_by_node",
}
TASK_COLUMNS = ("task_id", "attempt", "name", "final_state", "job_id", "node_id", "worker_id",
                "pid", "source", "pending_at", "submitted_at", "running_at", "finished_at",
                "failed_at", "duration_s", "error_type", "error_message", "inferred",
                "exception_class", "ray_session")
MAX_PAGE = 1000
# What a summary's row without a value holds, by dimension (failures sent without an
# error type count under the error dimension, so that its groups add up to the failures):
# `evagg query summary` and the dashboard's groups say these words and no others.
NO_VALUE_LABELS = {"job": "(no job id)", "driver": "(no job id)",
                   "error_type": "(no error type)"}
NO_VALUE_LABEL = "(none)"  # any other dimension's
# The run of ops sent without a run_id (Ray's ray_op/traced_remote, emitters.op outside a
# run), whose run_id is '': both doors, `evagg query runs` and the dashboard's Training
# runs page, name it with these words and no others.
NO_RUN = "ops without a run id"
NO_RUN_ROW = f"({NO_RUN})"


def summary(store: Store) -> Result:
    return store.execute(
        f"SELECT * FROM {store.summary_relation()} ORDER BY "
        "list_position(['all', 'state', 'name', 'error_type', 'job', 'node', 'driver'], "
        "dimension), "
        "tasks DESC, value", views=store.fold is None)


def aggregate(store: Store, by: str, limit: int = 200) -> Result:
    view = DIMENSIONS.get(by)
    if view is None:
        raise BadInput(f"cannot group by {by!r} (choose from {', '.join(DIMENSIONS)})")
    return store.execute(
        f"SELECT * FROM {view} ORDER BY tasks DESC, value LIMIT $limit", {"limit": limit}
    )


def tasks(store: Store, flt: TaskFilter, *, sort: str | None = None, order: str | None = None,
          limit: int = 100, offset: int = 0, columns: tuple[str, ...] = TASK_COLUMNS) -> Result:
    """One page of the task table and the number of matching tasks."""
    available = store.columns("tasks")
    where, params = flt.where(available)
    shown = ", ".join(c for c in columns if c in available)
    sql = (f"SELECT {shown}, count(*) OVER () AS _total FROM "
           f"(SELECT *, {TASK_TIME} AS task_time FROM tasks){where}"
           f"{task_order(sort, order, available)} LIMIT $limit OFFSET $offset")
    result = store.execute(sql, {**params, "limit": limit, "offset": offset},
                           views=not store.fold_view("tasks"))
    total = result.rows[0][-1] if result.rows else _count(store, where, params, offset)
    page = result.without("_total")
    page.total = int(total)
    return page


def _count(store: Store, where: str, params: dict[str, Any], offset: int) -> int:
    if offset == 0:
        return 0
    found = store.execute(f"SELECT count(*) AS n FROM tasks{where}", params,
                          views=not store.fold_view("tasks"))
    return int(found.rows[0][0])


def task_detail(store: Store, task_id: str, attempt: int | None,
                session: str | None = None) -> dict[str, Any]:
    """The folded task row(s) of one task id and every event behind them, in time order.
    Ray's clusters reuse task ids (each numbers its jobs from 01000000): `session` keeps
    one cluster's; without it every cluster's attempts of the id come, each naming its
    session."""
    task_id = clean_text("task_id", task_id)
    params: dict[str, Any] = {"task_id": task_id}
    where = event_where = ""
    if attempt is not None:
        where += " AND attempt = $attempt"
        event_where += " AND coalesce(attempt, 0) = $attempt"
        params["attempt"] = attempt
    if session:
        where += " AND ray_session = $session"
        event_where += " AND attrs['ray_session'] = $session"
        params["session"] = clean_text("session", session)
    rows = store.execute(
        f"SELECT * FROM tasks WHERE task_id = $task_id{where} ORDER BY ray_session, attempt",
        params)
    if not rows.rows:
        which = (f" attempt {attempt}" if attempt is not None else "") + (
            f" in session {session}" if session else "")
        raise NotFound(f"no task {task_id!r}{which}")
    # Filter the raw rows first, then deduplicate the few that match.
    events = store.execute(
        "SELECT time, state, attempt, name, node_id, worker_id, "
        "coalesce(pid, TRY_CAST(attrs['worker_pid'] AS INTEGER)) AS pid, duration_s, error_type, "
        "error_message, source, attrs['ray_session'] AS session, event_id FROM events_raw "
        "WHERE kind = 'task' AND (task_id = $task_id OR "
        # a task without a task_id is its one event, keyed by its event_id
        f"(event_id = $task_id AND coalesce(task_id, '') = '')){event_where} "
        "QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY received NULLS LAST) = 1 "
        "ORDER BY time, event_id", params)
    return {"attempts": rows.records(), "events": events.records()}


def runs(store: Store) -> Result:
    return store.execute("SELECT * FROM runs ORDER BY started_at DESC NULLS LAST, run_id")


def steps(store: Store, run_id: str) -> Result:
    run_id = clean_text("run", run_id)
    # nonfinite: the metrics an op of the step reported as NaN or infinite (the emitters
    # keep them out of `metrics`, so a NaN loss would otherwise vanish from its step)
    result = store.execute(
        "SELECT s.run_id, s.step, ops, failures, seconds, queue_s, started_at, ended_at, "
        "op_names, "
        "metrics, n.nonfinite FROM steps s LEFT JOIN ("
        "  SELECT step_group AS step, list_sort(list_distinct(flatten(list(nonfinite)))) "
        "    AS nonfinite FROM op_steps WHERE run_id = $run AND len(nonfinite) > 0 "
        "  GROUP BY step_group) n ON n.step IS NOT DISTINCT FROM s.step "
        "WHERE s.run_id = $run ORDER BY s.step NULLS LAST", {"run": run_id})
    if not result.rows:
        raise NotFound(f"no steps for run {run_id!r}")
    return result


def step_ops(store: Store, run_id: str) -> Result:
    return store.execute(
        "SELECT step_group AS step, step AS own_step, name, state, started_at, time, duration_s, "
        "metrics, error_type, error_message, op_id, pid, rank FROM op_steps "
        "WHERE run_id = $run "
        "ORDER BY step_group NULLS LAST, started_at", {"run": clean_text("run", run_id)})


def step_metrics(store: Store, run_id: str) -> Result:
    return store.execute(
        "SELECT metric, step, n, min, max, mean FROM step_metrics WHERE run_id = $run "
        "ORDER BY metric, step", {"run": clean_text("run", run_id)})


def search(store: Store, text: str, limit: int = 100) -> Result:
    """Tasks, ops and spans whose ids, names, error messages or stack traces hold `text`."""
    text = clean_text("search text", text).strip()
    if not text:
        raise BadInput("search text is empty")
    available = store.columns("tasks")
    task_where, params = TaskFilter(text=text).where(available)
    def match(*cols: str) -> str:
        return " OR ".join(f"contains(lower({c}), $text)" for c in cols)
    # A traced op is a span of its trace too (spans.sql): it is listed once, as the op.
    sql = f"""
        WITH found_ops AS (
            SELECT op_id, name, state, time, run_id, error_type, error_message, trace_id
            FROM ops WHERE {match('op_id', 'trace_id', 'name', 'run_id', 'error_type',
                                  'error_message', 'stack_trace')}
        )
        SELECT 'task' AS kind, task_id AS id, attempt, name, final_state AS state,
               {TASK_TIME} AS time, job_id AS scope, error_type, error_message
        FROM tasks{task_where}
        UNION ALL
        SELECT 'op', op_id, NULL, name, state, time, run_id, error_type, error_message
        FROM found_ops
        UNION ALL
        SELECT 'span', span_id, NULL, name, state, start_at, trace_id, error_type, error_message
        FROM spans AS s WHERE ({match('span_id', 'trace_id', 'name', 'error_type',
                                      'error_message', 'stack_trace')})
            AND NOT EXISTS (SELECT 1 FROM found_ops AS o
                            WHERE o.op_id = s.span_id AND o.trace_id = s.trace_id)
        ORDER BY time DESC NULLS LAST, kind, id LIMIT $limit"""
    return store.execute(sql, {**params, "limit": limit})


def traces(store: Store, limit: int = 100) -> Result:
    return store.execute(
        "SELECT * FROM traces ORDER BY started_at DESC NULLS LAST, trace_id LIMIT $limit",
        {"limit": limit})


def trace(store: Store, trace_id: str) -> Result:
    """Spans of one trace with start offsets (ms) from the trace's first span."""
    result = store.execute(
        "SELECT span_id, parent_span_id, name, state, service, span_kind, start_at, end_at, "
        "duration_s, error_type, error_message, stack_trace, attrs, node_id, step, "
        "(epoch_us(start_at) - min(epoch_us(start_at)) OVER ()) / 1000.0 AS offset_ms "
        "FROM spans WHERE trace_id = $trace ORDER BY start_at, span_id",
        {"trace": clean_text("trace_id", trace_id).strip().lower()})
    if not result.rows:
        raise NotFound(f"no spans for trace {trace_id!r}")
    return result


def agents(store: Store) -> Result:
    return store.execute("SELECT * EXCLUDE (metrics) FROM agents ORDER BY node_id"
                         if "metrics" in store.columns("agents") else
                         "SELECT * FROM agents ORDER BY node_id")


def losses(store: Store, limit: int = 100) -> Result:
    return store.execute("SELECT * FROM losses ORDER BY time DESC LIMIT $limit", {"limit": limit})


def page_args(values: dict[str, Any]) -> tuple[int, int]:
    limit = bounded_int("limit", values.get("limit"), 100, 1, MAX_PAGE)
    offset = bounded_int("offset", values.get("offset"), 0, 0, 10**9)
    return limit, offset
