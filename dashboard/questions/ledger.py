"""A run's request ledger: how many requests were enqueued, started, answered and failed,
and which are outstanding (enqueued at least `outstanding_after_s` ago, no outcome yet).

Built on the `requests` view (dashboard/sql/ledger.sql, created with the other views by
dashboard/lake/views.py). The queries are plain SQL with named parameters, so a `Store` runs
them as they are:

    sql, params = ledger.summary_query("run-7", 300)
    store.execute(sql, params)                        # dashboard.lake.results.Result

and `ledger(con, run_id, outstanding_after_s)` runs them on any DuckDB connection that
has an `events` view.
"""

from __future__ import annotations

import datetime as dt
import math
from importlib import resources
from typing import Any

import duckdb

from dashboard.lake.errors import BadInput
from dashboard.lake.results import from_cursor
from dashboard.questions.filters import clean_text

MAX_IDS = 100  # outstanding ids listed in the summary row; `outstanding()` lists them all
OPEN = "state IN ('ENQUEUED', 'STARTED')"
OLD = "coalesce(enqueued_at, started_at) <= $cutoff"

SUMMARY_SQL = f"""
SELECT
    $run AS run_id,
    count(*) AS requests,
    count(*) FILTER (WHERE enqueued_at IS NOT NULL) AS enqueued,
    count(*) FILTER (WHERE started_at IS NOT NULL) AS started,
    count(*) FILTER (WHERE state = 'ANSWERED') AS answered,
    count(*) FILTER (WHERE state = 'FAILED') AS failed,
    count(*) FILTER (WHERE state = 'ENQUEUED') AS waiting,
    count(*) FILTER (WHERE state = 'STARTED') AS running,
    count(*) FILTER (WHERE {OPEN} AND {OLD}) AS outstanding,
    coalesce(list_slice(list(request_id ORDER BY coalesce(enqueued_at, started_at), request_id)
                         FILTER (WHERE {OPEN} AND {OLD}), 1, {MAX_IDS}), []) AS outstanding_ids,
    sum(failures) AS failed_attempts,
    quantile_cont(queue_s, 0.5) AS queue_s_p50,
    quantile_cont(queue_s, 0.95) AS queue_s_p95,
    max(queue_s) AS queue_s_max,
    min(enqueued_at) AS first_enqueued_at,
    max(last_event_at) AS last_event_at
FROM requests
WHERE run_id = $run
HAVING count(*) > 0
"""

OUTSTANDING_SQL = f"""
SELECT request_id, name, state, enqueued_at, started_at, starts, failures,
       (epoch_us($now) - epoch_us(coalesce(enqueued_at, started_at))) / 1e6 AS age_s
FROM requests
WHERE run_id = $run AND {OPEN} AND {OLD}
ORDER BY coalesce(enqueued_at, started_at), request_id
LIMIT $limit
"""


def view_sql() -> str:
    return resources.files("dashboard").joinpath("sql", "ledger.sql").read_text("utf-8")


def _params(run_id: str, outstanding_after_s: float,
            now: dt.datetime | None) -> dict[str, Any]:
    run = clean_text("run", run_id)
    if isinstance(outstanding_after_s, bool) or not isinstance(outstanding_after_s, (int, float)) \
            or not math.isfinite(outstanding_after_s) or outstanding_after_s < 0:
        raise BadInput("outstanding_after_s must be a number of seconds, 0 or more")
    moment = now or dt.datetime.now(dt.UTC)
    if moment.tzinfo is None:
        raise BadInput("now must carry a time zone")
    return {"run": run, "now": moment,
            "cutoff": moment - dt.timedelta(seconds=float(outstanding_after_s))}


def summary_query(run_id: str, outstanding_after_s: float,
                  now: dt.datetime | None = None) -> tuple[str, dict[str, Any]]:
    """One row for the run (none when it has no requests)."""
    params = _params(run_id, outstanding_after_s, now)
    del params["now"]
    return SUMMARY_SQL, params


def outstanding_query(run_id: str, outstanding_after_s: float, now: dt.datetime | None = None,
                      limit: int = 1000) -> tuple[str, dict[str, Any]]:
    """One row per outstanding request, oldest first."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise BadInput("limit must be 1..100000")
    return OUTSTANDING_SQL, {**_params(run_id, outstanding_after_s, now), "limit": limit}


def _run(con: duckdb.DuckDBPyConnection, query: tuple[str, dict[str, Any]]
         ) -> list[dict[str, Any]]:
    con.execute(view_sql())
    sql, params = query
    return from_cursor(con.execute(sql, params)).records()


def ledger(con: duckdb.DuckDBPyConnection, run_id: str, outstanding_after_s: float,
           now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The run's ledger as one row (a dict), or [] when the run has no requests."""
    return _run(con, summary_query(run_id, outstanding_after_s, now))


def outstanding(con: duckdb.DuckDBPyConnection, run_id: str, outstanding_after_s: float,
                now: dt.datetime | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """The run's outstanding requests, oldest first."""
    return _run(con, outstanding_query(run_id, outstanding_after_s, now, limit))
