"""The overview page's numbers: tasks by final state and events over time by kind; and,
asked for apart, ops and failed ops.

With the task fold, both read small tables kept as files are folded: `task_state_counts`
and `event_timeline` (distinct events per second and kind). Every
bucket width is a whole number of seconds, so summing seconds into buckets gives the
same counts as bucketing each event's time.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dashboard.lake.store import Store

# Bucket widths for the events-over-time chart, smallest first (seconds).
WIDTHS_S = (1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600,
            86400, 7 * 86400, 30 * 86400)
MAX_BUCKETS = 120
NO_SPAN_WIDTH_S = 60  # when no event is charted (none, or every one ahead of now)
# Events stamped later than this after now are a producer's wrong clock (the year 2100):
# counted apart, not charted, where one of them stretched every bucket to 30 days.
AHEAD_OF_NOW_US = 24 * 3600 * 1_000_000


def bucket_width_s(first_us: int, last_us: int) -> int:
    span_s = max(0.0, (last_us - first_us) / 1e6)
    for width in WIDTHS_S:
        if span_s / width < MAX_BUCKETS:
            return width
    return WIDTHS_S[-1]


# Tasks as Ray counts them: every attempt but Ray's driver task, which is counted apart
# (DRIVERS_*) so the page can say where it went.
STATES_FROM_TASKS = ("(SELECT final_state AS state, count(*) AS tasks FROM tasks "
                     "WHERE coalesce(task_type, '') <> 'DRIVER_TASK' GROUP BY 1)")
DRIVERS_SQL = "SELECT count(*) AS n FROM tasks WHERE task_type = 'DRIVER_TASK'"
FOLDED_DRIVERS_SQL = ("SELECT coalesce(sum(tasks), 0) AS n FROM fold.summary_bins "
                      "WHERE dimension = 'driver'")
SPAN_SQL = ("SELECT epoch_us(min(time)) AS first, epoch_us(max(time)) AS last FROM events_raw "
            "WHERE epoch_us(time) <= $latest_us")
# Counts per bucket and kind in one pass; the events ahead of now get the NULL bucket.
COUNTS_SQL = ("SELECT CASE WHEN epoch_us(time) <= $latest_us THEN epoch_us(time) // $width_us "
              "END AS bucket, kind, count(*) AS events "
              "FROM events GROUP BY ALL ORDER BY bucket, kind")
# bucket_width_s in SQL, from the same widths: the first that makes under MAX_BUCKETS.
WIDTH_SQL = ("CASE " + " ".join(f"WHEN span_s / {w} < {MAX_BUCKETS} THEN {w}" for w in WIDTHS_S)
             + f" ELSE {WIDTHS_S[-1]} END")
# The span, its bucket width and the counts in one statement that reads event_timeline
# once: until the copy after a first open counts the compacted files' timeline, the view
# reads it from them (dashboard/lake/fold_place.py, 0.4 CPU s at 10 million events),
# and a statement for the span, then one for the counts, read it twice. Every row has
# the width (NULL without a span: every bucket is NULL then).
FOLDED_COUNTS_SQL = f"""
WITH timeline AS MATERIALIZED (
    SELECT second, kind, events, first_us, last_us FROM event_timeline
),
span AS (
    SELECT (max(last_us) - min(first_us)) / 1e6 AS s FROM timeline WHERE first_us <= $latest_us
),
width AS (
    SELECT {WIDTH_SQL} AS width_s
    FROM (SELECT greatest(0.0, s) AS span_s FROM span WHERE s IS NOT NULL)  -- no span: none
)
SELECT CASE WHEN first_us <= $latest_us THEN second // width_s END AS bucket, kind,
       CAST(sum(events) AS BIGINT) AS events, any_value(width_s) AS width_s
FROM timeline LEFT JOIN width ON true
GROUP BY bucket, kind ORDER BY bucket, kind"""


# The `ops` view's ops and final states (dashboard/sql/ops.sql), counted from the raw
# rows: five columns and no deduplication (copies of an event agree on its state), not
# every column of every op through the deduplicating `events`.
OPS_SQL = """
SELECT count(*) AS ops, count(*) FILTER (WHERE state = 'FAILED') AS failed FROM (
    SELECT coalesce(arg_max(state, time) FILTER (WHERE state IN ('FINISHED', 'FAILED')),
                    max(state)) AS state
    FROM events_raw
    WHERE kind = 'op'
      AND (span_id IS NOT NULL OR state IS NULL OR state IN ('FINISHED', 'FAILED'))
    GROUP BY coalesce(span_id, event_id))"""


def op_counts(store: Store) -> dict[str, int]:
    """Training ops, and how many failed: a failed backward is as much news as a failed
    task. Its own request (/api/op_counts), not part of the overview's: it scans the op
    events (about 0.14 s per million events here), where the overview reads only the
    task fold's small tables."""
    [found] = store.execute(OPS_SQL).records()
    return {"ops": int(found["ops"]), "failed": int(found["failed"])}


def overview(store: Store) -> dict[str, Any]:
    folded = store.fold is not None
    states = store.execute(
        f"SELECT * FROM {'task_state_counts' if folded else STATES_FROM_TASKS} ORDER BY 2 DESC, 1",
        views=not folded)
    drivers = store.execute(FOLDED_DRIVERS_SQL if folded else DRIVERS_SQL, views=not folded)
    latest = {"latest_us": int(dt.datetime.now(dt.UTC).timestamp() * 1e6) + AHEAD_OF_NOW_US}
    width, counts = folded_counts(store, latest) if folded else scanned_counts(store, latest)
    timeline: list[dict[str, Any]] = []
    kinds: dict[str, int] = {}
    ahead = 0
    for bucket, kind, events in counts:
        if bucket is None:  # stamped more than a day after now: counted, not charted
            ahead += events
            continue
        start = dt.datetime.fromtimestamp(bucket * width, tz=dt.UTC)
        timeline.append({"t": start.isoformat().replace("+00:00", "Z"),
                         "kind": kind, "events": events})
        kinds[kind or "?"] = kinds.get(kind or "?", 0) + events
    return {
        "states": states.records(),
        "tasks": sum(r["tasks"] for r in states.records()),
        "drivers": int(drivers.rows[0][0]) if drivers.rows else 0,
        "kinds": [{"kind": k, "events": n} for k, n in sorted(kinds.items(), key=lambda x: -x[1])],
        "events": sum(kinds.values()) + ahead,
        "bucket_s": width,
        "timeline": timeline,
        # events stamped more than a day after now: a producer's clock, not on the chart
        "ahead_of_now": ahead,
    }


def folded_counts(store: Store, latest: dict[str, int]) -> tuple[int, list[list[Any]]]:
    """The bucket width and (bucket, kind, events) from the fold's event_timeline."""
    rows = store.execute(FOLDED_COUNTS_SQL, latest, views=False).rows
    width = next((int(r[3]) for r in rows if r[3] is not None), NO_SPAN_WIDTH_S)
    return width, [r[:3] for r in rows]


def scanned_counts(store: Store, latest: dict[str, int]) -> tuple[int, list[list[Any]]]:
    """The bucket width and (bucket, kind, events) from every event."""
    span = store.execute(SPAN_SQL, latest)
    first, last = span.rows[0] if span.rows else (None, None)
    width = (bucket_width_s(first, last) if first is not None and last is not None
             else NO_SPAN_WIDTH_S)
    counts = store.execute(COUNTS_SQL, {"width_us": width * 1_000_000, **latest})
    return width, counts.rows
