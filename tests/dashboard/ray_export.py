"""Ray 2.60's Event Export written by hand, for tests that need shapes a local cluster does
not export (or a job no test should wait for): envelopes and task attempts as the core
worker and the GCS POST them (shared/ray_samples/), with ids and times made up."""

from __future__ import annotations

import base64
import itertools
from typing import Any

SESSION = "session_2026-11-29_12-05-18_302995_6318"
JOB = bytes.fromhex("01000000")
NIL_ACTOR = b"\xff" * 12 + JOB
DRIVER = b"\xff" * 8 + NIL_ACTOR  # Ray's driver task id: ff..ff01000000
ACTOR = bytes.fromhex("a5bb2facdd9ef499094add58") + JOB
NODE = bytes.fromhex("f480837016fe4d56882c2f517adf7db93ed5e2a1684bbee867f7e8ca")
_ids = itertools.count(1)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def at(seconds: float) -> str:
    whole, frac = divmod(round(seconds * 1e9), 10**9)
    return f"2026-11-29T12:{5 + whole // 60:02d}:{whole % 60:02d}.{frac:09d}Z"


def envelope(event_type: str, key: str, payload: dict[str, Any], time: str) -> dict[str, Any]:
    return {"eventId": b64(next(_ids).to_bytes(20, "big")), "sourceType": "CORE_WORKER",
            "eventType": event_type, "timestamp": time, "severity": "INFO",
            "sessionName": SESSION, key: payload, "nodeId": b64(NODE), "message": ""}


def attempt(task_id: bytes, name: str, *, task_type: str = "NORMAL_TASK", number: int = 0,
            start: float, run_s: float | None, end: str = "FINISHED",
            error: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """One attempt as Ray exports it: the definition, the owner's lifecycle and the
    executor's RUNNING."""
    ids = {"taskId": b64(task_id), "taskAttempt": number, "jobId": b64(JOB)}
    definition = {**ids, "taskType": task_type, "taskName": name, "language": "PYTHON",
                  "taskFunc": {"pythonFunctionDescriptor": {
                      "moduleName": "job", "className": "", "functionName": name or "",
                      "functionHash": ""}},
                  "requiredResources": {"CPU": 1.0}, "parentTaskId": b64(DRIVER),
                  "placementGroupId": b64(b"\xff" * 18), "serializedRuntimeEnv": "{}"}
    events = [envelope("TASK_DEFINITION_EVENT", "taskDefinitionEvent", definition, at(start))]
    owner = [{"state": "PENDING_ARGS_AVAIL", "timestamp": at(start)}]
    if run_s is None:  # ended before it ran: no duration
        owner.append({"state": end, "timestamp": at(start + 0.5)})
        ended: dict[str, Any] = {**ids, "stateTransitions": owner}
        if error:
            ended["rayErrorInfo"] = {"errorType": error[0], "errorMessage": error[1]}
        return [*events, envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", ended,
                                  at(start + 0.5))]
    worker = b64(next(_ids).to_bytes(28, "big"))
    owner.append({"state": end, "timestamp": at(start + 0.1 + run_s)})
    done: dict[str, Any] = {**ids, "stateTransitions": owner, "nodeId": b64(NODE),
                            "workerId": worker, "workerPid": 0}
    if error:
        done["rayErrorInfo"] = {"errorType": error[0], "errorMessage": error[1]}
    running = {**ids, "stateTransitions": [{"state": "RUNNING", "timestamp": at(start + 0.1)}],
               "workerPid": 6000 + next(_ids), "nodeId": "", "workerId": ""}
    return [*events, envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", running,
                              at(start + 0.1)),
            envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", done, at(start + run_s))]
