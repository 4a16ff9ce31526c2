"""The task fold in mergeable parts, written once for every engine: the one owner of what
a task attempt is made of its events (dashboard/sql/tasks.sql says the same over raw
events in one pass, for the readers that fold from scratch).

Three statements, each a SELECT over a relation named by the caller:

* `partial_select(rows)`: the partial fold of event rows, one row per (task_id, attempt,
  session), each arg_max kept with the key it won with. A node-hour's task fragment is
  this over that hour's events (sinks/fragments/build.py); the dashboard's incremental
  fold is this over each batch of files (dashboard/sql/fold.sql).
* `merge_select(parts)`: the same aggregates over partial rows: a min of mins, a max of
  maxes, an arg_max over the kept keys, a sum of event counts. Order-free, and a merge of
  one row is that row, so fragments of any nodes and hours merge in one GROUP BY.
  `merge_select_split(parts)` is the same, cheaper where most keys have one row.
* `attempts_select(merged)`: tasks.sql's final columns from merged rows.

Keys are BIGINTs that sort as tasks.sql's struct keys sort: 2^55 per rank step above 55
bits of time (microseconds since the epoch, offset by 2^54; NULL time last).
"""

from __future__ import annotations

from typing import Final

from sinks.fragments.dialects import Dialect

# The event columns the fold reads, with their SQL types: a reader projects missing
# ones as NULL of this type.
FOLD_COLUMNS: Final = {
    "event_id": "VARCHAR", "time": "TIMESTAMPTZ", "kind": "VARCHAR", "source": "VARCHAR",
    "name": "VARCHAR", "state": "VARCHAR", "task_id": "VARCHAR", "attempt": "INTEGER",
    "parent_id": "VARCHAR", "job_id": "VARCHAR", "node_id": "VARCHAR", "worker_id": "VARCHAR",
    "actor_id": "VARCHAR", "host": "VARCHAR", "pid": "INTEGER", "trace_id": "VARCHAR",
    "duration_s": "DOUBLE",
    "error_type": "VARCHAR", "error_message": "VARCHAR", "stack_trace": "VARCHAR",
    "attrs": "MAP(VARCHAR, VARCHAR)",
}
STEP: Final = 36028797018963968  # 2^55: one rank step of a key
RANK_STEP: Final = 72057594037927936  # 2^56: a final_key's rank step (its low bit is FAILED)
_TIME_OFFSET: Final = 18014398509481984  # 2^54
_TIME_MAX: Final = 36028797018963966
_TIME_NULL: Final = 36028797018963967
INFERRED_RANK: Final = 7  # an end evagg inferred: below every end a producer reported


def state_rank(d: Dialect, state: str, inferred: str) -> str:
    """DEFINED < PENDING < SUBMITTED < RUNNING < an inferred end < FINISHED = FAILED."""
    end = f"CASE WHEN {inferred} IS NULL THEN 8 ELSE {INFERRED_RANK} END"
    return (f"CASE {state} WHEN 'DEFINED' THEN 0 WHEN 'PENDING' THEN 2 "
            f"WHEN 'SUBMITTED' THEN 4 WHEN 'RUNNING' THEN 6 "
            f"WHEN 'FINISHED' THEN {end} WHEN 'FAILED' THEN {end} END")


def final_state(d: Dialect, key: str) -> str:
    """The state a final_key was made of (NULL for NULL): its rank above the time, and
    its low bit for FAILED over FINISHED, name one state, so the key alone gives what an
    arg_max of the state by it would (one aggregate fewer per attempt)."""
    return (f"CASE {d.div(key, str(RANK_STEP))} WHEN 0 THEN 'DEFINED' WHEN 2 THEN 'PENDING' "
            f"WHEN 4 THEN 'SUBMITTED' WHEN 6 THEN 'RUNNING' "
            f"ELSE CASE {key} % 2 WHEN 1 THEN 'FAILED' WHEN 0 THEN 'FINISHED' END END")


def partial_select(d: Dialect, rows: str, *, distinct_events: bool = False) -> str:
    """The partial fold of the event rows of relation `rows` (FOLD_COLUMNS). `events`
    counts rows with an event_id, or distinct event ids with `distinct_events` (rows that
    may hold copies: the dashboard's fold takes copies away itself, in fold.sql)."""
    inferred = d.map_get("attrs", "evagg_inferred")
    time_us = d.epoch_us("time")
    error = d.struct({"error_type": "error_type", "exception_class": "exception_class",
                      "error_message": "error_message", "stack_trace": "stack_trace"})
    has_error = "error_type IS NOT NULL OR error_message IS NOT NULL"
    final_key = "max(CASE WHEN state_rank IS NOT NULL THEN final_rank END)"
    return f"""
WITH task_events AS (
    SELECT
        coalesce(nullif(task_id, ''), event_id) AS task_id,
        coalesce(attempt, 0) AS attempt_no,
        coalesce({d.map_get("attrs", "ray_session")}, '') AS session,
        event_id, time, source, name, state, parent_id, job_id, node_id, worker_id,
        actor_id, host, pid, trace_id, duration_s, error_type, error_message, stack_trace,
        {d.map_get("attrs", "worker_pid")} AS worker_pid,
        {d.map_get("attrs", "ray_task_type")} AS task_type,
        {d.map_get("attrs", "ray_function")} AS function,
        {d.map_get("attrs", "ray_actor_repr_name")} AS actor_repr,
        {d.map_get("attrs", "exception_class")} AS exception_class,
        {inferred} AS inferred,
        {state_rank(d, "state", inferred)} AS state_rank,
        {inferred} IS NOT NULL AS inferred_event,
        coalesce(greatest(0, least({time_us} + {_TIME_OFFSET}, {_TIME_MAX})),
                 {_TIME_NULL}) AS time_bits
    FROM {rows}
    WHERE kind = 'task' AND coalesce(nullif(task_id, ''), event_id) IS NOT NULL
),
ranked AS (
    SELECT
        *,
        CASE WHEN state = 'DEFINED' THEN {STEP} ELSE 0 END + time_bits AS name_rank,
        (state_rank * {STEP} + time_bits) * 2
            + CAST(state = 'FAILED' AS BIGINT) AS final_rank,
        CASE WHEN state = 'RUNNING' THEN {2 * STEP} WHEN state_rank = 8 THEN {STEP} ELSE 0 END
            + time_bits AS node_rank,
        CASE WHEN state_rank = 8 THEN {2 * STEP} WHEN state = 'RUNNING' THEN {STEP} ELSE 0 END
            + time_bits AS worker_rank,
        CASE WHEN inferred_event THEN 0 ELSE {STEP} END + time_bits AS error_rank
    FROM task_events
)
SELECT
    task_id,
    attempt_no AS attempt,
    session,
    {d.arg_max("name", "CASE WHEN coalesce(name, '') <> '' THEN name_rank END")} AS name,
    max(CASE WHEN coalesce(name, '') <> '' THEN name_rank END) AS name_key,
    {final_state(d, final_key)} AS final_state,
    {final_key} AS final_key,
    min(CASE WHEN state = 'PENDING' THEN time END) AS pending_at,
    min(CASE WHEN state = 'SUBMITTED' THEN time END) AS submitted_at,
    min(CASE WHEN state = 'RUNNING' THEN time END) AS running_at,
    min(CASE WHEN state = 'FINISHED' AND NOT inferred_event THEN time END) AS finished_at,
    min(CASE WHEN state = 'FAILED' AND NOT inferred_event THEN time END) AS failed_at,
    min(CASE WHEN state_rank = {INFERRED_RANK} THEN time END) AS inferred_at,
    {d.arg_min("inferred", f"CASE WHEN state_rank = {INFERRED_RANK} THEN time_bits END")}
        AS inferred,
    min(CASE WHEN state_rank = {INFERRED_RANK} THEN time_bits END) AS inferred_key,
    {d.arg_max("duration_s",
               "CASE WHEN state_rank = 8 AND duration_s IS NOT NULL THEN time_bits END")}
        AS reported_s,
    max(CASE WHEN state_rank = 8 AND duration_s IS NOT NULL THEN time_bits END)
        AS reported_key,
    max(CASE WHEN job_id <> '' THEN job_id END) AS job_id,
    {d.arg_max("node_id", "CASE WHEN node_id <> '' THEN node_rank END")} AS node_id,
    max(CASE WHEN node_id <> '' THEN node_rank END) AS node_key,
    {d.arg_max("host", "CASE WHEN host <> '' THEN node_rank END")} AS host,
    max(CASE WHEN host <> '' THEN node_rank END) AS host_key,
    {d.arg_max("worker_id", "CASE WHEN worker_id <> '' THEN worker_rank END")} AS worker_id,
    max(CASE WHEN worker_id <> '' THEN worker_rank END) AS worker_key,
    max({d.try_int("worker_pid")}) AS pid_attr,
    max(CASE WHEN state = 'RUNNING' THEN pid END) AS pid_running,
    max(pid) AS pid_any,
    max(CASE WHEN actor_id <> '' THEN actor_id END) AS actor_id,
    max(CASE WHEN parent_id <> '' THEN parent_id END) AS parent_id,
    max(CASE WHEN trace_id <> '' THEN trace_id END) AS trace_id,
    max(task_type) AS task_type,
    max(function) AS function,
    max(actor_repr) AS actor_repr,
    bool_or(coalesce(state, '') <> '') AS has_state,
    {d.arg_max(error, f"CASE WHEN {has_error} THEN error_rank END")} AS error,
    max(CASE WHEN {has_error} THEN error_rank END) AS error_key,
    max(source) AS source,
    min(time) AS first_seen,
    max(time) AS last_seen,
    count({"DISTINCT " if distinct_events else ""}event_id) AS events
FROM ranked
GROUP BY task_id, attempt_no, session"""


def merge_select(d: Dialect, parts: str) -> str:
    """The partial rows of relation `parts` merged: one row per (task_id, attempt, session)."""
    am, an = d.arg_max, d.arg_min
    return f"""
SELECT
    task_id, attempt, session,
    {am("name", "name_key")} AS name, max(name_key) AS name_key,
    {am("final_state", "final_key")} AS final_state, max(final_key) AS final_key,
    min(pending_at) AS pending_at, min(submitted_at) AS submitted_at,
    min(running_at) AS running_at, min(finished_at) AS finished_at,
    min(failed_at) AS failed_at,
    min(inferred_at) AS inferred_at,
    {an("inferred", "inferred_key")} AS inferred, min(inferred_key) AS inferred_key,
    {am("reported_s", "reported_key")} AS reported_s, max(reported_key) AS reported_key,
    max(job_id) AS job_id,
    {am("node_id", "node_key")} AS node_id, max(node_key) AS node_key,
    {am("host", "host_key")} AS host, max(host_key) AS host_key,
    {am("worker_id", "worker_key")} AS worker_id, max(worker_key) AS worker_key,
    max(pid_attr) AS pid_attr, max(pid_running) AS pid_running, max(pid_any) AS pid_any,
    max(actor_id) AS actor_id, max(parent_id) AS parent_id, max(trace_id) AS trace_id,
    max(task_type) AS task_type, max(function) AS function,
    max(actor_repr) AS actor_repr, bool_or(has_state) AS has_state,
    {am("error", "error_key")} AS error, max(error_key) AS error_key,
    max(source) AS source, min(first_seen) AS first_seen, max(last_seen) AS last_seen,
    CAST(sum(events) AS BIGINT) AS events
FROM {parts}
GROUP BY task_id, attempt, session"""


def merge_select_split(d: Dialect, parts: str) -> str:
    """merge_select for partial rows most of whose keys have one row (a node-hour's
    fragments: an attempt is in two only when its owner and executor were two nodes, or
    it crossed an hour): those pass as they are, a merge of one row being that row, and
    only the rest are grouped, which costs a fraction of grouping every row. DuckDB's SQL
    (SEMI and ANTI JOIN)."""
    key = "task_id, attempt, session"
    twice = f"(SELECT {key} FROM {parts} GROUP BY {key} HAVING count(*) > 1)"
    return f"""
SELECT p.* FROM {parts} AS p ANTI JOIN {twice} AS t USING ({key})
UNION ALL BY NAME
{merge_select(d, f"(SELECT p.* FROM {parts} AS p SEMI JOIN {twice} AS t USING ({key}))")}"""


def duration_expression(d: Dialect) -> str:
    """tasks.sql's duration_s of a merged row: what the producer reported, else its end
    minus its start."""
    end = ("CASE final_state WHEN 'FAILED' THEN coalesce(failed_at, inferred_at) "
           "ELSE coalesce(finished_at, inferred_at) END")
    return (f"coalesce(reported_s, ({d.epoch_us(end)} - {d.epoch_us('running_at')}) "
            f"/ 1e6)")


def attempts_select(d: Dialect, merged: str) -> str:
    """tasks.sql's columns (the `tasks` view, before evagg's inferred ends) from the
    merged rows of relation `merged`."""
    final_rank = d.div("final_key", str(RANK_STEP))
    shown = f"coalesce(error_key >= {STEP} OR {final_rank} = {INFERRED_RANK}, true)"
    task = "PARTITION BY task_id, session"
    return f"""
SELECT
    task_id,
    attempt,
    coalesce(name, max(name) OVER ({task}), max(function) OVER ({task}), actor_repr) AS name,
    coalesce(final_state, 'UNKNOWN') AS final_state,
    pending_at,
    submitted_at,
    running_at,
    CASE WHEN final_state = 'FINISHED' THEN coalesce(finished_at, inferred_at)
         ELSE finished_at END AS finished_at,
    CASE WHEN final_state = 'FAILED' THEN coalesce(failed_at, inferred_at)
         ELSE failed_at END AS failed_at,
    {duration_expression(d)} AS duration_s,
    job_id,
    node_id,
    worker_id,
    coalesce(pid_attr, pid_running, pid_any) AS pid,
    actor_id,
    parent_id,
    trace_id,
    CASE WHEN shown THEN error.error_type END AS error_type,
    CASE WHEN shown THEN error.exception_class END AS exception_class,
    CASE WHEN shown THEN error.error_message END AS error_message,
    CASE WHEN shown THEN error.stack_trace END AS stack_trace,
    source,
    task_type,
    function,
    nullif(session, '') AS ray_session,
    first_seen,
    last_seen,
    events,
    CASE WHEN {final_rank} = {INFERRED_RANK} THEN inferred END AS inferred,
    host
FROM (SELECT *, {shown} AS shown FROM {merged}) AS m
WHERE has_state OR name IS NOT NULL"""
