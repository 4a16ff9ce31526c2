"""What a stored batch says about attempts that start and end: a few columns of the
rows that matter, picked with Arrow compute in the worker thread that builds the
spool record, so the event loop only applies short tuples.

Rows that matter: `task` rows with a state (Ray's and emitters'), `op` rows with a
span_id, and Ray's `job` and `actor` rows. Everything else (heartbeats, spans, metrics
events) is dropped by one vectorised filter before anything becomes a Python object.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

WATCHED_KINDS = pa.array(["task", "op", "job", "actor"])
INFERRED = "evagg_inferred"  # the attrs key that marks an end evagg inferred


class Fact(NamedTuple):
    kind: str
    state: str
    source: str
    session: str  # attrs ray_session; "" for emitters
    key_id: str  # task_id (or event_id without one), span_id, job_id or actor_id
    attempt: int
    job_id: str | None
    run_id: str | None
    node_id: str | None
    worker_id: str | None
    name: str | None
    step: int | None
    task_id: str | None  # an op's task
    pid: int | None  # the producer's, stamped by the agent from the socket's credentials
    worker_pid: int | None  # Ray's worker (or driver) pid from attrs
    time_ns: int
    inferred: bool


_COLUMNS = ("kind", "state", "source", "task_id", "event_id", "span_id", "job_id",
            "actor_id", "attempt", "run_id", "node_id", "worker_id", "name", "step", "pid")


def facts_of(batch: pa.RecordBatch) -> list[Fact]:
    """The facts of one batch, in row order; [] for a batch with none."""
    if batch.num_rows == 0:
        return []
    mask = pc.and_(pc.is_in(batch.column("kind"), value_set=WATCHED_KINDS),
                   pc.is_valid(batch.column("state")))
    if not pc.any(mask).as_py():
        return []
    picked = batch.filter(mask)
    cols = {name: picked.column(name).to_pylist() for name in _COLUMNS}
    times = pc.cast(picked.column("time"), pa.int64()).to_pylist()
    attrs = picked.column("attrs")
    session = _attr(attrs, "ray_session")
    worker_pid = _attr(attrs, "worker_pid")
    driver_pid = _attr(attrs, "ray_driver_pid")
    inferred = _attr(attrs, INFERRED)
    out = []
    for i, kind in enumerate(cols["kind"]):
        out.append(Fact(
            kind, cols["state"][i], cols["source"][i] or "", session[i] or "",
            _key_id(kind, cols, i) or "", cols["attempt"][i] or 0, cols["job_id"][i],
            cols["run_id"][i], cols["node_id"][i], cols["worker_id"][i], cols["name"][i],
            cols["step"][i], cols["task_id"][i], cols["pid"][i],
            _pid(worker_pid[i] or driver_pid[i]), times[i] or 0, bool(inferred[i])))
    return out


def _key_id(kind: str, cols: dict[str, list[object]], i: int) -> str | None:
    """What the readers key the row on (dashboard/sql/tasks.sql, ops.sql, raystate)."""
    if kind == "task":
        return str(cols["task_id"][i] or cols["event_id"][i] or "") or None
    column = {"op": "span_id", "job": "job_id", "actor": "actor_id"}[kind]
    value = cols[column][i]
    return str(value) if value else None


def _attr(attrs: pa.Array, key: str) -> list[str | None]:
    found: list[str | None] = pc.map_lookup(attrs, key, "first").to_pylist()
    return found


def _pid(text: str | None) -> int | None:
    if not text:
        return None
    try:
        pid = int(text)
    except ValueError:
        return None
    return pid if pid > 0 else None
