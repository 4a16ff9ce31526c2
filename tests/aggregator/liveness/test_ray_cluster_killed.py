"""A whole Ray cluster SIGKILLed with work in flight: after the grace no attempt of its
job reads RUNNING, PENDING or SUBMITTED in `evagg query tasks`, each one that was open
says evagg inferred its end, and the job and its actor are ended too; the same when the
agent was SIGKILLed before the cluster died and started again after.

Each test starts its own cluster (tests/aggregator/liveness/ray_driver.py) in a session
of its own and kills it by process group: the driver's group (GCS, raylet, Ray's
agents) and each worker's own group (the raylet gives every worker one), found by that
session id, so no other Ray cluster on the machine is touched (never `ray stop`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import REPO, AgentProcess
from tests.aggregator.liveness.lake import sql, tasks
from tests.ports import free_port
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.slow
GRACE_S = 3
RAY_EXPORT_ENV = {
    "RAY_enable_core_worker_ray_event_to_aggregator": "1",
    "RAY_enable_ray_event": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # else Ray writes a token into the home directory
}
OPEN = ("RUNNING", "PENDING", "SUBMITTED")


@contextlib.contextmanager
def ray_cluster(agent: AgentProcess, workdir: Path) -> Iterator[subprocess.Popen[str]]:
    """The driver process of a new local cluster exporting into `agent`, once it has
    submitted its work; whatever is left of the cluster is killed at the end."""
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths stay short
    env = {**os.environ, **RAY_EXPORT_ENV, "PYTHONPATH": str(REPO),
           "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR": f"{agent.http_url}/ray/events"}
    with (workdir / "driver.log").open("w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.aggregator.liveness.ray_driver", temp_dir,
             str(free_port())], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
            text=True, start_new_session=True)
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        said = (workdir / "driver.log").read_text
        assert line.startswith("{"), f"the driver said {line!r}:\n{said()}"
        yield driver
    finally:
        kill_cluster(driver)
        shutil.rmtree(temp_dir, ignore_errors=True)


def kill_cluster(driver: subprocess.Popen[str]) -> None:
    """SIGKILL every process group of the driver's session, then reap the driver."""
    for group in process_groups_of_session(driver.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    driver.wait()


def process_groups_of_session(session: int) -> set[int]:
    groups = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text(errors="replace")
        except OSError:
            continue  # exited meanwhile
        fields = text[text.rfind(")") + 2:].split()
        if int(fields[3]) == session:
            groups.add(int(fields[2]))
    return groups


def attempts(agent: AgentProcess) -> list[dict[str, Any]]:
    return list(tasks(agent).values())


def work_in_flight(agent: AgentProcess) -> bool:
    """The actor's method and a task RUNNING, two tasks PENDING behind them."""
    rows = attempts(agent)
    def count(name: str, state: str) -> int:
        return sum(r["name"] == name and r["final_state"] == state for r in rows)
    return (count("Holder.hold", "RUNNING") == 1 and count("sleeper", "RUNNING") >= 1
            and count("sleeper", "PENDING") >= 2)


def still_open(agent: AgentProcess) -> list[dict[str, Any]]:
    return [r for r in attempts(agent) if r["final_state"] in OPEN]


def inferred_rows(agent: AgentProcess, kind: str) -> list[dict[str, Any]]:
    return sql(agent, f"SELECT * EXCLUDE (metrics, nonfinite), attrs['evagg_inferred'] AS said, "
                      f"attrs['ray_session'] AS session FROM events WHERE kind = '{kind}' "
                      "AND source = 'evagg' AND attrs['evagg_inferred'] IS NOT NULL")


def stored_ends(agent: AgentProcess) -> dict[tuple[str, int, str], dict[str, Any]]:
    """The task ends the agent inferred and stored, by (task_id, attempt, session)."""
    return {(r["task_id"], r["attempt"], r["session"]): r for r in inferred_rows(agent, "task")}


def assert_everything_ended(agent: AgentProcess, open_before: list[dict[str, Any]]) -> None:
    # Wait for the agent's stored ends, not merely for no open attempt: while a killed
    # agent is silent past its silent_after_s, readers end its attempts themselves
    # (dashboard/sql/ends.sql), and take that back when its next heartbeat lands.
    wanted = {(r["task_id"], r["attempt"], r["ray_session"]) for r in open_before}
    wait_until(lambda: wanted <= stored_ends(agent).keys() and not still_open(agent),
               60 + GRACE_S,
               lambda: f"an end stored for each of {sorted(wanted)} and no attempt "
                       f"RUNNING/PENDING/SUBMITTED; stored: {sorted(stored_ends(agent))}, "
                       f"still open: {still_open(agent)}\n{agent.log()}")
    now = tasks(agent)
    ended = stored_ends(agent)
    for before in open_before:
        after = now[before["task_id"]]
        assert (after["final_state"], after["error_type"]) == ("FAILED", "WORKER_DIED"), after
        row = ended[(before["task_id"], before["attempt"], before["ray_session"])]
        assert row["said"].startswith("inferred by evagg on ") and " gone at " in row["said"]
        assert row["job_id"] == before["job_id"]
    job_id, session = open_before[0]["job_id"], open_before[0]["ray_session"]
    jobs = {(r["job_id"], r["state"], r["session"]) for r in inferred_rows(agent, "job")}
    assert jobs == {(job_id, "FINISHED", session)}
    actors = {(r["state"], r["error_type"], r["session"]) for r in inferred_rows(agent, "actor")}
    assert actors == {("DEAD", "WORKER_DIED", session)}
    assert agent.metric("evagg_inferred_ends_total") >= len(open_before) + 2


def test_a_cluster_killed_with_work_in_flight_leaves_nothing_running(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    agent = agent_factory(agent_toml=f'inferred_end_grace = "{GRACE_S}s"').start()
    with ray_cluster(agent, tmp_path) as driver:
        wait_until(lambda: work_in_flight(agent), 240,
                   lambda: f"work in flight; tasks: {attempts(agent)}\n{agent.log()}")
        open_before = still_open(agent)
        kill_cluster(driver)
        assert_everything_ended(agent, open_before)


def test_an_agent_killed_before_the_cluster_ends_it_after_its_restart(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    agent = agent_factory(agent_toml=f'inferred_end_grace = "{GRACE_S}s"').start()
    with ray_cluster(agent, tmp_path) as driver:
        wait_until(lambda: work_in_flight(agent), 240,
                   lambda: f"work in flight; tasks: {attempts(agent)}\n{agent.log()}")
        open_before = wait_for(lambda: still_open(agent), 10, "open attempts")
        agent.kill()
        kill_cluster(driver)
        agent.start()
        assert_everything_ended(agent, open_before)
        assert "from before this start" in agent.log()
