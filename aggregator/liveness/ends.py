"""The rows of an inferred end: what Ray (or the producer) would have said, marked.

Every row has source "evagg" and attrs["evagg_inferred"], one sentence saying what evagg
saw; the readers rank such an end below any real end of the same attempt, so a real
one arriving later wins. Ids repeat what the open rows had (hex Ray ids, attrs
ray_session), so the end folds into the same row of the `tasks` view, `ops` view and
Ray's State API. event_id is a digest of what the row ends: inferring the same end again
(after a restart) stores a duplicate the readers drop, never a second end.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from aggregator.liveness.facts import INFERRED
from aggregator.liveness.openset import Actor, Attempt, Job

RAY_WORKER_DIED = ("The worker died unexpectedly while executing this task "
                   "(no terminal event arrived from Ray)")
RAY_DRIVER_DIED = ("The job's driver died before this task finished "
                   "(no terminal event arrived from Ray)")


def end_id(*parts: object) -> str:
    text = "\0".join(str(p) for p in (*parts, "evagg-inferred-end"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def saw(host: str, what: str, pid: int, gone_ns: int) -> str:
    """The marker's sentence: "inferred by evagg on h: worker pid 6525 gone at ...". """
    return (f"inferred by evagg on {host}: {what} pid {pid} gone at {when(gone_ns)} "
            "with no terminal event")


def attempt_end(attempt: Attempt, *, host: str, what: str, pid: int,
                gone_ns: int) -> dict[str, Any]:
    """A task attempt's FAILED, or an op's FAILED, for `attempt`."""
    marker = saw(host, what, pid, gone_ns)
    row: dict[str, Any] = {
        "event_id": end_id(attempt.kind, attempt.session, attempt.key_id, attempt.attempt),
        "time": gone_ns, "kind": attempt.kind, "source": "evagg", "state": "FAILED",
        "job_id": attempt.job_id, "run_id": attempt.run_id, "node_id": attempt.node_id,
        "worker_id": attempt.worker_id, "attrs": {INFERRED: marker},
    }
    if attempt.kind == "op":
        row.update(span_id=attempt.key_id, name=attempt.name, step=attempt.step,
                   task_id=attempt.task_id, error_type="PROCESS_EXITED",
                   error_message=f"the process (pid {pid}) exited during this op "
                                 f"without sending its end; {marker}")
        return row
    row.update(task_id=attempt.key_id, attempt=attempt.attempt)
    if attempt.ray:
        row["attrs"]["ray_session"] = attempt.session
        row.update(error_type="WORKER_DIED", error_message=(
            RAY_DRIVER_DIED if what == "driver" else RAY_WORKER_DIED) + f"; {marker}")
    else:
        row.update(error_type="PROCESS_EXITED",
                   error_message=f"the process (pid {pid}) exited during this task "
                                 f"without sending its end; {marker}")
    return row


def job_end(job: Job, *, host: str, gone_ns: int) -> dict[str, Any]:
    return {"event_id": end_id("job", job.session, job.job_id), "time": gone_ns,
            "kind": "job", "source": "evagg", "state": "FINISHED", "job_id": job.job_id,
            "attrs": {INFERRED: saw(host, "driver", job.driver_pid, gone_ns),
                      "ray_session": job.session}}


def actor_end(actor: Actor, *, host: str, what: str, pid: int,
              gone_ns: int) -> dict[str, Any]:
    marker = saw(host, what, pid, gone_ns)
    cause = ("The actor died because its worker process died" if what == "worker"
             else "The actor died because its job's driver died")
    return {"event_id": end_id("actor", actor.session, actor.actor_id), "time": gone_ns,
            "kind": "actor", "source": "evagg", "state": "DEAD", "actor_id": actor.actor_id,
            "job_id": actor.job_id, "node_id": actor.node_id, "worker_id": actor.worker_id,
            "error_type": "WORKER_DIED", "error_message": f"{cause}; {marker}",
            "attrs": {INFERRED: marker, "ray_session": actor.session}}
