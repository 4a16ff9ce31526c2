"""Which Ray session (one `ray start` / `ray.init()` cluster) a question is about.

A store can hold many Ray clusters; a new one starts its job and task ids again from
the same values, so answers never mix sessions. Ray's session name is kept on every
row (attrs ray_session, the `tasks` view's ray_session). The State API routes answer
for the newest session (the one whose tasks started last) unless the URL names one:
`/ray/<session>/api/v0/...`, where <session> is the whole name or a prefix of exactly
one (`session_2026-05-01_10-00` is enough). `/api/ray/sessions` lists them.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from dashboard.lake.errors import BadInput, NotFound
from dashboard.lake.store import Store

SESSIONS = """
SELECT ray_session AS session, epoch_us(min(first_seen)) AS first_us,
       epoch_us(max(last_seen)) AS last_us, count(*) AS task_attempts,
       count(DISTINCT job_id) AS jobs
FROM tasks WHERE source = 'ray' AND ray_session IS NOT NULL
GROUP BY ray_session ORDER BY first_us DESC, session DESC
"""




@dataclass(frozen=True, slots=True)
class Known:
    version: str
    sessions: list[dict[str, Any]]
    tasks: int  # every row of the tasks view, Ray's or not


_known: weakref.WeakKeyDictionary[Store, Known] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def known(store: Store) -> Known:
    """The sessions, read once per store version (a pass over every task)."""
    version = store.refresh(views=False).fingerprint
    with _lock:
        hit = _known.get(store)
    if hit is not None and hit.version == version:
        return hit
    found = Known(version, store.execute(SESSIONS, views=False).records(),
                  int(store.execute("SELECT count(*) FROM tasks", views=False).rows[0][0]))
    with _lock:
        _known[store] = found
    return found


def sessions(store: Store) -> list[dict[str, Any]]:
    """The store's Ray sessions, newest first."""
    return known(store).sessions


def only_tasks_of(store: Store, session: str) -> bool:
    """Whether every row of the tasks view is one of this session's Ray tasks: then a
    question about the session needs no filter on it (a pass over every task saved)."""
    found = known(store)
    return any(s["session"] == session and s["task_attempts"] == found.tasks
               for s in found.sessions)


def choose(store: Store, wanted: str | None) -> str:
    """The session named (whole or by a unique prefix), else the newest."""
    known_names = [s["session"] for s in sessions(store)]
    return _pick(store, known_names, wanted)


def _pick(store: Store, known: list[str], wanted: str | None) -> str:
    if not known:
        raise NotFound(f"no Ray tasks in {store.location} yet: is Ray exporting its events "
                       "to an evagg agent (docs/ray.md, \"Turn it on\")?")
    if not wanted:
        return str(known[0])
    if wanted in known:
        return wanted
    matching = [s for s in known if s.startswith(wanted)]
    if len(matching) == 1:
        return str(matching[0])
    listed = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "")
    if matching:
        raise BadInput(f"Ray session {wanted!r} matches {len(matching)} sessions: give more "
                       f"of its name ({', '.join(matching[:5])})")
    raise NotFound(f"no Ray session {wanted!r} in {store.location}; its sessions, newest "
                   f"first: {listed}")


_SESSIONS_OF = """
SELECT attrs['ray_session'] AS session FROM events_raw
WHERE source = 'ray' AND {column} = $id AND attrs['ray_session'] IS NOT NULL
GROUP BY ALL ORDER BY session DESC  -- a session is named for its start: newest first
"""


def choose_for(store: Store, wanted: str | None, *, task_id: str | None = None,
               actor_id: str | None = None, node_id: str | None = None,
               worker_id: str | None = None) -> str:
    """The session of a question about one task, actor or node: the one named, else the
    one session that holds it. Ray's clusters reuse task and actor ids (each numbers its
    jobs from 01000000), so the newest session is no guess for an id: one found in
    several is refused with their names."""
    asked = [(what, column, key) for what, column, key in (
        ("task", "task_id", task_id), ("actor", "actor_id", actor_id),
        ("node", "node_id", node_id), ("worker", "worker_id", worker_id)) if key]
    if wanted or not asked:
        return choose(store, wanted)
    what, column, key = asked[0]
    holding = [str(row[0]) for row in store.execute(
        _SESSIONS_OF.format(column=column), {"id": key}).rows]
    if len(holding) > 1:
        raise BadInput(f"{what} {key} is in {len(holding)} Ray sessions (Ray's clusters reuse "
                       f"ids): name one (--session, or the dashboard's /ray/<session>/ "
                       f"address), newest first: {', '.join(holding[:10])}")
    return holding[0] if holding else choose(store, None)


def split_job_key(job: str) -> tuple[str, str | None]:
    """A job as the summaries name it (dashboard/sql/keys.sql's job_key: 01000000@session_...)
    as its id and its session; a bare id has no session."""
    job_id, at, session = job.rpartition("@")
    if at and job_id and session.startswith("session_"):
        return job_id, session
    return job, None


def job_in_session(store: Store, job: str, session: str | None) -> tuple[str, str]:
    """The job id and the session a question about one job means: `job` may name its
    session (job@session), which must then agree with `session` if that is given too."""
    job_id, named = split_job_key(job)
    if named and session and not named.startswith(session):
        raise BadInput(f"job {job} names session {named}, not {session}")
    return job_id, choose(store, named or session)
