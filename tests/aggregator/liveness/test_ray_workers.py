"""Ray's RUNNING events POSTed to a real agent as Ray's exporter posts them, naming real
local processes as their workers: a worker that dies gets its attempt ended (FAILED,
WORKER_DIED, in the attempt's own row of the tasks view), Ray's real end arriving later
still wins, and a workerPid that is no live process here is never declared gone."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from tests.agentproc import AgentProcess
from tests.aggregator.liveness.lake import failed_task, inferred_ends, state_of, tasks
from tests.waiting import wait_for, wait_until

SESSION = "session_2026-12-01_10-00-00_000000_1"
JOB = base64.b64encode(bytes.fromhex("01000000")).decode()


def task_id(n: int) -> tuple[str, str]:
    """A Ray task id as Ray sends it (base64) and as the tasks view shows it (hex)."""
    raw = bytes([n] * 12) + b"\xff" * 8 + bytes.fromhex("01000000")
    return base64.b64encode(raw).decode(), raw.hex()


def lifecycle(task: str, state: str, **extra: Any) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"eventId": base64.b64encode(os.urandom(28)).decode(), "sourceType": "CORE_WORKER",
            "eventType": "TASK_LIFECYCLE_EVENT", "timestamp": now, "severity": "INFO",
            "sessionName": SESSION,
            "taskLifecycleEvent": {"taskId": task, "taskAttempt": 0, "jobId": JOB,
                                   "stateTransitions": [{"state": state, "timestamp": now}],
                                   **extra}}


def post(agent: AgentProcess, events: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{agent.http_url}/ray/events", method="POST",
                                     data=orjson.dumps(events),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


def unused_pid() -> int:
    """A pid no process has here now (a worker of another pid namespace or host)."""
    return next(pid for pid in range(4_000_000, 3_000_000, -7)
                if not os.path.exists(f"/proc/{pid}"))


def test_a_dead_worker_ends_its_attempt_and_rays_late_end_still_wins(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(agent_toml='inferred_end_grace = "2s"').start()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        (dies_b64, dies), (elsewhere_b64, elsewhere) = task_id(7), task_id(8)
        post(agent, [lifecycle(dies_b64, "RUNNING", workerPid=worker.pid),
                     lifecycle(elsewhere_b64, "RUNNING", workerPid=unused_pid())])
        wait_until(lambda: state_of(agent, dies) == state_of(agent, elsewhere) == "RUNNING",
                   60, "both attempts RUNNING")
    finally:
        worker.kill()
        worker.wait()

    row = wait_for(lambda: failed_task(agent, dies), 60,
                   lambda: f"the dead worker's attempt FAILED\n{agent.log()}")
    assert row is not None
    assert (row["attempt"], row["job_id"], row["ray_session"]) == (0, "01000000", SESSION)
    assert row["error_type"] == "WORKER_DIED"
    [end] = inferred_ends(agent, "task", "task_id", dies)
    assert f"worker pid {worker.pid} gone at " in end["said"]
    assert agent.metric('evagg_inferred_ends_total{kind="task",reason="worker_gone"}') == 1
    # the other attempt's worker was never alive here: nothing is inferred for it
    assert state_of(agent, elsewhere) == "RUNNING"
    assert inferred_ends(agent, "task", "task_id", elsewhere) == []
    assert agent.metric('evagg_liveness_untracked_total{reason="not_visible"}') >= 1

    post(agent, [lifecycle(dies_b64, "FINISHED", workerPid=0)])  # Ray's own end, late
    wait_until(lambda: state_of(agent, dies) == "FINISHED", 60,
               lambda: f"Ray's late FINISHED to win: {tasks(agent).get(dies)}")


def job_defined(driver: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Ray's definition of job 01000000, driven by `driver` (Ray's entrypoint is the
    driver's own command line)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"eventId": base64.b64encode(os.urandom(28)).decode(), "sourceType": "GCS",
            "eventType": "DRIVER_JOB_DEFINITION_EVENT", "timestamp": now, "severity": "INFO",
            "sessionName": SESSION,
            "driverJobDefinitionEvent": {"jobId": JOB, "driverPid": str(driver.pid),
                                         "entrypoint": subprocess.list2cmdline(driver.args)}}


def test_a_job_defined_just_before_the_agent_was_killed_ends_when_its_driver_died_meanwhile(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(agent_toml='inferred_end_grace = "2s"').start()
    sleep = [sys.executable, "-c", "import time; time.sleep(3600)"]
    worker, driver = subprocess.Popen(sleep), subprocess.Popen(sleep)
    (running_b64, running), (pending_b64, pending) = task_id(9), task_id(10)
    try:
        post(agent, [lifecycle(running_b64, "RUNNING", workerPid=worker.pid)])
        # The agent saves its open set at most every 5 s: once this attempt is in the
        # saved copy, the job below lands between two saves, as a job defined just
        # before a crash does.
        snapshot = agent.state_dir / "liveness.json"
        wait_until(lambda: snapshot.exists() and b'"RUNNING"' in snapshot.read_bytes(), 30,
                   "the open set saved with the RUNNING attempt")
        post(agent, [job_defined(driver), lifecycle(pending_b64, "PENDING")])
        agent.kill()  # SIGKILL at once: no drain, no last snapshot
        driver.kill()
        driver.wait()
        agent.start()

        row = wait_for(lambda: failed_task(agent, pending), 60,
                       lambda: f"the dead driver's PENDING attempt FAILED\n{agent.log()}")
        assert row is not None and row["error_type"] == "WORKER_DIED"
        [end] = inferred_ends(agent, "task", "task_id", pending)
        assert f"driver pid {driver.pid} gone at " in end["said"], end
        [job] = inferred_ends(agent, "job", "job_id", "01000000")
        assert job["state"] == "FINISHED", job
        assert state_of(agent, running) == "FAILED"  # its job ended with its driver
    finally:
        for process in (worker, driver):
            process.kill()
            process.wait()
