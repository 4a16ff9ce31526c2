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
