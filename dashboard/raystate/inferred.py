"""Ends of actors and driver jobs that nobody exported, put on as Ray's GCS would.

dashboard/sql/ends.sql does this for task attempts, and its `jobs` view owns when each
driver job ended and how evagg knows (`evagg query jobs` prints it). For the few actors
and jobs of a session it is put on here, on the rows `entities.entity_rows` grouped:
  * each job the `jobs` view reads ended gets one row with that end (JOB_END), which
    `entities.job` reads, so Ray's `ray list jobs` says what `evagg query jobs` says;
  * an actor that is not detached dies with its job's driver (Ray: OWNER_DIED);
  * in a session that no live agent reports any more (every agent that received its
    tasks has been silent too long), every actor still alive dies with its node
    (NODE_DIED).
An actor's inferred death is marked with attrs `evagg_inferred` (the mark an agent's own
inferred rows carry, so `entities` prefers any real end over it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dashboard.lake.store import Store

Row = dict[str, Any]
Grouped = dict[str, dict[str, list[Row]]]
SESSION_SILENCE = """
SELECT ended, epoch_us(last_heard_at) AS last_us FROM session_liveness WHERE session = $session
"""
JOB_ENDS = """
SELECT job_id, epoch_us(ended_at) AS end_us, how_known FROM jobs
WHERE coalesce(ray_session, '') = $session AND ended_at IS NOT NULL
"""
JOB_END = "evagg-job-end"  # the event_id of the row that carries a job's end
EXPORTED_END = "exported by Ray"  # the jobs view's how_known of a job's own end (ends.sql)


def add_inferred_ends(store: Store, session: str, grouped: Grouped) -> None:
    """Append the inferred end rows to `grouped` (kind -> id -> rows in time order)."""
    found = store.execute(SESSION_SILENCE, {"session": session}).records()
    silent_since = found[0]["last_us"] if found and found[0]["ended"] else None
    job_ends = _job_ends(store, session)
    for job_id, rows in grouped["job"].items():
        if job_id in job_ends:
            rows.append(_job_end_row(rows[0], *job_ends[job_id]))
    for rows in grouped["actor"].values():
        if _end(rows, "DEAD") is not None:
            continue
        job_end = job_ends.get(rows[0]["job_id"] or "")
        if job_end is not None and not _detached(rows):
            text = (f"evagg inferred this end: the actor's owner, the driver of job "
                    f"{rows[0]['job_id']}, ended at {_iso(job_end[0])}")
            rows.append(_row("actor", rows[0], "DEAD", job_end[0], text, "OWNER_DIED"))
        elif silent_since is not None:
            rows.append(_row("actor", rows[0], "DEAD", silent_since,
                             _silence_text(silent_since), "NODE_DIED"))


def _job_ends(store: Store, session: str) -> dict[str, tuple[int, str]]:
    """job id -> (when it ended, how evagg knows), as the `jobs` view reads them."""
    found = store.execute(JOB_ENDS, {"session": session}).records()
    return {r["job_id"]: (r["end_us"], r["how_known"]) for r in found}


def _job_end_row(like: Row, us: int, how_known: str) -> Row:
    return {"event_id": JOB_END, "kind": "job", "name": None, "state": "FINISHED",
            "us": us, "job_id": like["job_id"], "node_id": None, "worker_id": None,
            "actor_id": None, "error_type": None, "error_message": how_known, "attrs": {}}


def _end(rows: list[Row], state: str) -> tuple[int, str] | None:
    ends = [r for r in rows if r["state"] == state and r["us"] is not None]
    if not ends:
        return None
    first = min(ends, key=lambda r: ((r["attrs"] or {}).get("evagg_inferred") is not None,
                                     r["us"]))
    return first["us"], (first["attrs"] or {}).get("evagg_inferred") or ""


def _detached(rows: list[Row]) -> bool:
    return any((r["attrs"] or {}).get("ray_is_detached") == "true" for r in rows)


def _row(kind: str, like: Row, state: str, us: int, text: str, error_type: str | None) -> Row:
    return {"event_id": f"evagg-inferred-{kind}-{state}", "kind": kind, "name": None,
            "state": state, "us": us, "job_id": like["job_id"], "node_id": None,
            "worker_id": None, "actor_id": like["actor_id"], "error_type": error_type,
            "error_message": text, "attrs": {"evagg_inferred": text}}


def _silence_text(us: int) -> str:
    return (f"evagg inferred this end: no agent of this Ray session has reported since "
            f"{_iso(us)}; the cluster is taken to have ended then")


def _iso(us: int) -> str:
    moment = dt.datetime.fromtimestamp(us / 1e6, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
