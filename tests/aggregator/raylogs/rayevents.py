"""Ray's own event shapes that name log files, as Ray 2.60 POSTs them (see the captured
samples): an executor's RUNNING event with `taskLogInfo`, and a worker's definition."""

from __future__ import annotations

import base64
import os
import urllib.request
from typing import Any

import orjson

SESSION = "session_2026-11-29_12-05-18_302995_6318"
NODE_HEX = "f4808070" + "16fe4d5a882c2f517adf7db93ed5e2a1684bbee867f7fcca"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def lifecycle_event(task_hex: str, fields: dict[str, Any], session: str = SESSION,
                    stamp: str = "2026-11-29T12:05:23.095703647Z") -> dict[str, Any]:
    """A TASK_LIFECYCLE_EVENT of `task_hex` with `fields` in its payload, as Ray 2.60
    posts it."""
    return {
        "eventId": _b64(os.urandom(28)), "sourceType": "CORE_WORKER",
        "eventType": "TASK_LIFECYCLE_EVENT", "timestamp": stamp,
        "severity": "INFO", "sessionName": session,
        "taskLifecycleEvent": {"taskId": _b64(bytes.fromhex(task_hex)), "jobId": "AQAAAA==",
                               **fields},
        "nodeId": _b64(bytes.fromhex(NODE_HEX)), "message": "",
    }


def running_event(task_hex: str, stdout: str, stderr: str, start: int = 0,
                  attempt: int = 0, session: str = SESSION,
                  ends: tuple[int, int] | None = None,
                  err_start: int | None = None) -> dict[str, Any]:
    """The executor's RUNNING event (its ends equal its starts); with `ends`, the event
    the executor sends when the attempt is over: no transition, the ends known."""
    err_start = start if err_start is None else err_start
    out_end, err_end = ends or (start, err_start)
    transitions = [] if ends else [{"state": "RUNNING",
                                    "timestamp": "2026-11-29T12:05:23.094021037Z"}]
    return lifecycle_event(task_hex, {
        "stateTransitions": transitions, "workerPid": 6525,
        "taskLogInfo": {"stdoutFile": stdout, "stderrFile": stderr,
                        "stdoutStart": str(start), "stdoutEnd": str(out_end),
                        "stderrStart": str(err_start), "stderrEnd": str(err_end)},
        "taskAttempt": attempt, "nodeId": "", "workerId": ""}, session)


def failed_event(task_hex: str, error_type: str, attempt: int = 0,
                 session: str = SESSION) -> dict[str, Any]:
    """The executor's (TASK_EXECUTION_EXCEPTION) or the owner's (WORKER_DIED) FAILED, with
    no log info, as Ray 2.60 sends them."""
    return lifecycle_event(task_hex, {
        "stateTransitions": [{"state": "FAILED", "timestamp": "2026-11-29T12:05:23.097083830Z"}],
        "rayErrorInfo": {"errorType": error_type,
                         "errorMessage": "User exception:\nValueError: raised"},
        "taskAttempt": attempt, "workerPid": 0}, session, "2026-11-29T12:05:23.097083830Z")


def submitted_event(task_hex: str, worker_hex: str, session: str = SESSION) -> dict[str, Any]:
    """The owner's SUBMITTED_TO_WORKER, naming the worker: all a task whose worker then
    died (os._exit) ever says of where it ran."""
    return lifecycle_event(task_hex, {
        "stateTransitions": [{"state": "SUBMITTED_TO_WORKER",
                              "timestamp": "2026-11-29T12:05:23.093545293Z"}],
        "taskAttempt": 0, "workerPid": 0, "nodeId": _b64(bytes.fromhex(NODE_HEX)),
        "workerId": _b64(bytes.fromhex(worker_hex))}, session)


def task_hex(n: int) -> str:
    return f"{n:016x}" + "ffffffffffffffff" + "01000000"


def post(agent_url: str, events: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{agent_url}/ray/events", data=orjson.dumps(events),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200, answer.read()
