"""Agent on demand with real processes: drivers that start at the same moment share one
agent, their events reach the Parquet, and the agent drains and exits after the last one."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from emitters.autostart import agent_log_path, users_lock_path
from tests.agentproc import REPO, AgentProcess, query_lake, scrape, short_socket_dir, sum_of
from tests.emitters.ondemand import agent_pids
from tests.ports import free_port
from tests.waiting import wait_until

# A driver: imports emitters, says it is ready, waits for the go file, asks for an agent
# (configure(start_agent=True), or EVAGG_START_AGENT=1 and its first event), emits,
# flushes, reports, then stays alive until its release file appears.
DRIVER = r"""
import os, sys, time
from pathlib import Path
import orjson
import emitters
from emitters import autostart
work, prefix, count, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
flush_timeout = float(sys.argv[5])
(work / f"ready-{prefix}").touch()
while not (work / "go").exists():
    time.sleep(0.001)
if mode == "configure":
    emitters.configure(start_agent=True, run_id=prefix)
else:
    emitters.configure(run_id=prefix)
for i in range(count):
    emitters.emit(kind="task", name="work", state="FINISHED", task_id=f"{prefix}-{i}")
flushed = emitters.flush(flush_timeout)
lease = autostart.current_lease()
print(orjson.dumps({"lease": None if lease is None else [lease.socket_path, lease.started,
                    lease.pid], "flushed": flushed, "http": lease and lease.http,
                    "socket_env": os.environ.get("EVAGG_SOCKET")}).decode(), flush=True)
while not (work / f"release-{prefix}").exists():
    time.sleep(0.01)
"""

# Asks for an agent with a short lock deadline and reports what it got.
IMPATIENT = r"""
import sys
from emitters import autostart
lease = autostart.ensure_agent(sys.argv[1], lock_timeout=0.5)
print("none" if lease is None else "lease", flush=True)
"""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """An environment whose embedded-default agent lives entirely under temporary dirs."""
    runtime = short_socket_dir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EVAGG_") and k != "PYTHONPATH"}
    env.update({"XDG_RUNTIME_DIR": str(runtime), "XDG_STATE_HOME": str(tmp_path / "state"),
                "XDG_DATA_HOME": str(tmp_path / "data"), "PYTHONPATH": str(REPO),
                "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}"})
    sock = runtime / "evagg" / "events.sock"
    yield {"env": env, "socket": sock, "lake": tmp_path / "data" / "evagg" / "parquet",
           "work": tmp_path}
    for pid in agent_pids(sock):  # only agents of this test's socket
        os.kill(pid, 9)


def start_driver(home: dict[str, Any], prefix: str, count: int, mode: str,
                 extra_env: dict[str, str] | None = None,
                 flush_timeout: float = 30.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(home["work"]), prefix, str(count), mode,
         str(flush_timeout)],
        cwd=REPO, env={**home["env"], **(extra_env or {})}, stdout=subprocess.PIPE)


def on_demand_checks(http: str) -> float:
    """How often the agent on demand has looked whether anyone still uses it (0 before
    its HTTP port opens, a moment after its socket)."""
    try:
        return sum_of(scrape(f"http://{http}"), "evagg_on_demand_checks_total")
    except (urllib.error.URLError, ConnectionError):
        return 0.0


def report(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"driver exited with {proc.wait()} before reporting"
    result: dict[str, Any] = orjson.loads(line)
    return result


def release(home: dict[str, Any], proc: subprocess.Popen[bytes], prefix: str) -> None:
    (home["work"] / f"release-{prefix}").touch()
    assert proc.wait(30) == 0


def stale_socket(path: Path) -> None:
    """A socket file whose listener is gone, as a crashed agent leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def test_two_drivers_at_once_share_one_agent_that_leaves_after_the_last(
        home: dict[str, Any]) -> None:
    stale_socket(home["socket"])
    a = start_driver(home, "a", 300, "configure")
    b = start_driver(home, "b", 300, "environment", {"EVAGG_START_AGENT": "1"})
    wait_until(lambda: all((home["work"] / f"ready-{p}").exists() for p in "ab"), 60,
             "drivers importing emitters")
    (home["work"] / "go").touch()
    reports = {"a": report(a), "b": report(b)}
    sock = str(home["socket"])
    for r in reports.values():
        assert r["flushed"] is True and r["lease"][0] == sock and r["socket_env"] == sock
    starters = [r["lease"] for r in reports.values() if r["lease"][1]]
    assert len(starters) == 1, reports
    pids = agent_pids(home["socket"])
    assert pids == [starters[0][2]], (pids, reports)

    looked = on_demand_checks(reports["a"]["http"])
    release(home, a, "a")
    wait_until(lambda: on_demand_checks(reports["a"]["http"]) >= looked + 3, 60,
               "three of the agent's looks at the users lock after a left")
    assert agent_pids(home["socket"]) == pids  # it stays while b holds its lease
    release(home, b, "b")
    wait_until(lambda: not agent_pids(home["socket"]), 60, "the agent to drain and exit")
    assert not home["socket"].exists()
    log = agent_log_path(home["socket"]).read_text()
    assert "no process uses this agent any more" in log
    rows = dict(query_lake(home["lake"], "SELECT run_id, count(DISTINCT task_id) FROM events "
                                         "WHERE kind = 'task' GROUP BY run_id"))
    assert rows == {"a": 300, "b": 300}


def test_no_agent_is_started_when_one_already_runs(home: dict[str, Any],
                                                   tmp_path: Path) -> None:
    workdir = tmp_path / "running"
    workdir.mkdir()
    with AgentProcess(workdir) as agent:
        driver = start_driver(home, "c", 50, "configure",
                              {"EVAGG_SOCKET": str(agent.socket_path)})
        (home["work"] / "go").touch()
        result = report(driver)
        assert result["lease"] == [str(agent.socket_path), False, None]
        assert not agent_pids(agent.socket_path)
        agent.wait_delivered(50)
        release(home, driver, "c")
        wait_until(lambda: agent.metric("evagg_open_connections") == 0, 30,
                   "the agent to see the driver's connection close")
        assert agent.running  # an agent someone else started is not ours to stop
        assert ": stopping" not in agent.log()  # nor signalled: a stop would be said there
        assert not agent_pids(agent.socket_path)
    assert query_lake(agent.lake_dir, "SELECT count(*) FROM events WHERE run_id = 'c'") \
        == [(50,)]


def test_an_agent_that_cannot_start_leaves_the_driver_running(home: dict[str, Any]) -> None:
    missing = home["work"] / "missing.toml"
    driver = start_driver(home, "d", 5, "configure", {"EVAGG_CONFIG": str(missing)},
                          flush_timeout=1.0)
    (home["work"] / "go").touch()
    assert driver.stdout is not None
    out = driver.stdout.readline()  # the flush fails after its deadline: no agent listens
    result = orjson.loads(out)
    assert result["lease"] is None and result["flushed"] is False
    release(home, driver, "d")
    assert "does not exist" in agent_log_path(home["socket"]).read_text()
    assert not agent_pids(home["socket"])


def test_a_draining_agent_makes_a_new_user_wait_and_give_up_at_its_deadline(
        home: dict[str, Any]) -> None:
    users = users_lock_path(home["socket"])
    users.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(users, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a leaving agent holds until it exits
        out = subprocess.run([sys.executable, "-c", IMPATIENT, str(home["socket"])],
                             cwd=REPO, env=home["env"], capture_output=True, timeout=60)
        assert out.stdout.strip() == b"none", out.stderr
        assert b"still draining" in out.stderr
        assert not agent_pids(home["socket"])
    finally:
        os.close(fd)


def test_the_agent_leaves_when_nobody_holds_the_users_lock(home: dict[str, Any]) -> None:
    users = users_lock_path(home["socket"])
    users.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(users, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "run", "--socket", str(home["socket"]),
         "--exit-when-unused", str(users)],
        cwd=REPO, env=home["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: home["socket"].exists(), 30, "the agent's socket")
        http = home["env"]["EVAGG_HTTP_LISTEN"]
        wait_until(lambda: on_demand_checks(http) >= 3, 60, "three looks at the users lock")
        assert proc.poll() is None  # a user holds the lock
        os.close(fd)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
