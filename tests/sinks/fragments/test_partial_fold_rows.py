"""The partial fold gives the rows it gave before it was made cheaper, over odd events.

`partial_select` was rewritten for the agent's CPU (a node-hour's fragment is written with
it): the final state read off its key instead of an arg_max of its own, the keys' rank
steps added instead of multiplied. Every reader and every engine merges the rows it
writes, so a rewrite must not change one: REFERENCE below is the SQL as it was before,
and Hypothesis runs both over the same odd rows (NULL and empty ids, equal times, times
the keys clamp, unknown states, inferred ends, errors without a type, attrs or none).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinks.fragments.dialects import DIALECTS, Dialect, dialect
from sinks.fragments.task_fold import (
    FOLD_COLUMNS,
    INFERRED_RANK,
    RANK_STEP,
    STEP,
    final_state,
    partial_select,
    state_rank,
)

OFFSET, TIME_MAX, TIME_NULL = 2**54, 2**55 - 2, 2**55 - 1


def reference(d: Dialect, rows: str, *, distinct_events: bool = False) -> str:
    """partial_select as it was before the rewrite, word for word."""
    inferred = d.map_get("attrs", "evagg_inferred")
    time_us = d.epoch_us("time")
    error = d.struct({"error_type": "error_type", "exception_class": "exception_class",
                      "error_message": "error_message", "stack_trace": "stack_trace"})
    has_error = "error_type IS NOT NULL OR error_message IS NOT NULL"
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
        coalesce(greatest(0, least({time_us} + {OFFSET}, {TIME_MAX})),
                 {TIME_NULL}) AS time_bits
    FROM {rows}
    WHERE kind = 'task' AND coalesce(nullif(task_id, ''), event_id) IS NOT NULL
),
ranked AS (
    SELECT
        *,
        CASE WHEN state = 'DEFINED' THEN 1 ELSE 0 END * {STEP} + time_bits AS name_rank,
        (state_rank * {STEP} + time_bits) * 2
            + CAST(state = 'FAILED' AS BIGINT) AS final_rank,
        CASE WHEN state = 'RUNNING' THEN 2 WHEN state_rank = 8 THEN 1 ELSE 0 END
            * {STEP} + time_bits AS node_rank,
        CASE WHEN state_rank = 8 THEN 2 WHEN state = 'RUNNING' THEN 1 ELSE 0 END
            * {STEP} + time_bits AS worker_rank,
        CASE WHEN inferred_event THEN 0 ELSE 1 END * {STEP} + time_bits AS error_rank
    FROM task_events
)
SELECT
    task_id,
    attempt_no AS attempt,
    session,
    {d.arg_max("name", "CASE WHEN coalesce(name, '') <> '' THEN name_rank END")} AS name,
    max(CASE WHEN coalesce(name, '') <> '' THEN name_rank END) AS name_key,
    {d.arg_max("state", "CASE WHEN state_rank IS NOT NULL THEN final_rank END")} AS final_state,
    max(CASE WHEN state_rank IS NOT NULL THEN final_rank END) AS final_key,
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


EPOCH = datetime(2026, 1, 2, 3, tzinfo=UTC)
# Equal times (ties), a microsecond apart, and times the keys clamp (before 1399, after 2540).
TIMES = [None, EPOCH, EPOCH + timedelta(microseconds=1), EPOCH + timedelta(seconds=30),
         datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC),
         datetime(1970, 1, 1, tzinfo=UTC)]
STATES = [None, "", "DEFINED", "PENDING", "SUBMITTED", "RUNNING", "FINISHED", "FAILED",
          "LOST"]
ATTR_KEYS = {"ray_session": ["", "s1", "s2"], "worker_pid": ["12", "x", ""],
             "ray_task_type": ["NORMAL_TASK", ""], "ray_function": ["f", "g"],
             "ray_actor_repr_name": ["A(1)"], "exception_class": ["ValueError", ""],
             "evagg_inferred": ["", "process exited"]}


def some(*values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


ROW = st.fixed_dictionaries({
    "event_id": some(None, "", "e1", "e2", "e3"),
    "time": st.sampled_from(TIMES),
    "kind": some("task", "task", "task", "op", None),
    "source": some(None, "evagg", "ray"),
    "name": some(None, "", "a", "b"),
    "state": st.sampled_from(STATES),
    "task_id": some(None, "", "t1", "t2"),
    "attempt": some(None, 0, 1),
    "parent_id": some(None, "", "p"),
    "job_id": some(None, "", "j1", "j2"),
    "node_id": some(None, "", "n1", "n2"),
    "worker_id": some(None, "", "w1", "w2"),
    "actor_id": some(None, "", "a1"),
    "host": some(None, "", "h1", "h2"),
    "pid": some(None, 1, 2),
    "trace_id": some(None, "", "tr"),
    "duration_s": some(None, 0.0, 1.5, -2.0, math.inf),
    "error_type": some(None, None, "", "ValueError"),
    "error_message": some(None, None, "", "bad"),
    "stack_trace": some(None, "", "trace"),
    "attrs": st.one_of(st.none(), st.dictionaries(
        st.sampled_from(sorted(ATTR_KEYS)), st.sampled_from(["", "s1", "12", "x", "ray"]),
        max_size=4)),
})

ARROW_TYPES = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(),
               "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
               "MAP(VARCHAR, VARCHAR)": pa.map_(pa.string(), pa.string())}


def table_of(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema([(c, ARROW_TYPES[t]) for c, t in FOLD_COLUMNS.items()])
    cells = [{**r, "attrs": None if r["attrs"] is None else list(r["attrs"].items())}
             for r in rows]
    return pa.Table.from_pylist(cells, schema=schema)


def folded(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    return sorted(repr(row) for row in con.execute(sql).fetchall())


CON = duckdb.connect(config={"threads": 1})  # one for every example: a connect is slow


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ROW, max_size=24), st.booleans())
def test_the_partial_fold_gives_the_rows_it_gave_before(rows: list[dict[str, Any]],
                                                        distinct: bool) -> None:
    CON.register("odd_rows", table_of(rows))
    d = dialect("duckdb")
    assert (folded(CON, partial_select(d, "odd_rows", distinct_events=distinct))
            == folded(CON, reference(d, "odd_rows", distinct_events=distinct)))


def test_the_partial_folds_columns_are_the_ones_they_were() -> None:
    con = duckdb.connect()
    con.register("odd_rows", table_of([]))
    d = dialect("duckdb")
    assert (con.execute(f"DESCRIBE {partial_select(d, 'odd_rows')}").fetchall()
            == con.execute(f"DESCRIBE {reference(d, 'odd_rows')}").fetchall())


def test_the_final_state_read_off_its_key_is_the_state_that_made_it() -> None:
    con = duckdb.connect()
    d = dialect("duckdb")
    for state in STATES[2:8]:
        for inferred in (None, "process exited"):
            rank = con.execute(f"SELECT {state_rank(d, '$s', '$i')}",
                               {"s": state, "i": inferred}).fetchone()
            assert rank is not None
            for time_bits in (0, 1, TIME_MAX, TIME_NULL):
                key = (rank[0] * STEP + time_bits) * 2 + (state == "FAILED")
                assert key // RANK_STEP == rank[0]
                got = con.execute(f"SELECT {final_state(d, '$k::BIGINT')}",
                                  {"k": key}).fetchone()
                assert got == (state,)
    assert con.execute(f"SELECT {final_state(d, 'NULL::BIGINT')}").fetchone() == (None,)


def test_every_dialect_prints_the_final_state_of_a_key() -> None:
    for name in DIALECTS:
        text = final_state(dialect(name), "k")
        assert "'FAILED'" in text and "'DEFINED'" in text
