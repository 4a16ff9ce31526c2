"""Ray-shaped task events as Ray's Event Export posts them (an envelope around a task's
definition or its lifecycle of state transitions), made up for the tests that need a tie
or an odd case the captured payloads under tests/fixtures/ray do not have. Any label
makes an id here; tests/dashboard/ray_export.py makes whole attempts with ids laid out
as Ray lays them out."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

SESSION = "session_2026-11-29_12-05-18_302995_6318"  # the fixtures' first Ray session
NODE = "9ICDcBb+TVaILC9Ret99uT7V4qFoS77oZ/foyg=="
S = 10**9


def b64(label: str, size: int) -> str:
    return base64.b64encode(hashlib.sha256(label.encode()).digest()[:size]).decode()


def rfc3339(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // S)) + f".{ns % S:09d}Z"


def envelope(kind: str, body_key: str, body: dict[str, Any], session: str,
             at: int) -> dict[str, Any]:
    return {"eventId": b64(json.dumps([kind, body, session]), 28), "sourceType": "CORE_WORKER",
            "eventType": kind, "timestamp": rfc3339(at), "severity": "INFO",
            "sessionName": session, body_key: body, "nodeId": NODE, "message": ""}


def definition(task: str, name: str, at: int, session: str = SESSION,
               attempt: int = 0) -> dict[str, Any]:
    body = {"taskId": task, "taskName": name, "jobId": "AQAAAA==", "taskAttempt": attempt,
            "taskType": "NORMAL_TASK", "language": "PYTHON",
            "taskFunc": {"pythonFunctionDescriptor": {
                "moduleName": "workload", "functionName": name, "className": ""}}}
    return envelope("TASK_DEFINITION_EVENT", "taskDefinitionEvent", body, session, at)


def lifecycle(task: str, *transitions: tuple[str, int], session: str = SESSION,
              attempt: int = 0) -> dict[str, Any]:
    body = {"taskId": task, "jobId": "AQAAAA==", "taskAttempt": attempt, "nodeId": NODE,
            "workerId": "", "workerPid": 0,
            "stateTransitions": [{"state": s, "timestamp": rfc3339(t)} for s, t in transitions]}
    return envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", body, session,
                    transitions[-1][1])
