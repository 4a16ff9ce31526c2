"""The README's task examples through a real agent and the real `evagg` command: a task
event without a task_id is a task of its own, and the duration a producer reports is the
one the tasks view, the summary and the dashboard's API show (docs/event-schema.md,
"Tasks")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO, AgentProcess
from tests.dashboard.serve import serving

README_PYTHON = """
import emitters
emitters.configure(run_id="exp-42")
emitters.emit(kind="task", name="load_shard", state="FINISHED", duration_s=0.8)
emitters.emit(kind="task", name="reported", state="RUNNING", task_id="r1")
emitters.emit(kind="task", name="reported", state="FINISHED", task_id="r1", duration_s=8.0)
assert emitters.flush(10.0)
"""


def evagg(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True, timeout=120)


def query_json(lake: Path, *args: str) -> list[dict[str, Any]]:
    done = evagg("query", "--data", str(lake), *args, "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def poll_tasks(lake: Path, name: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """`evagg query tasks --name NAME` until it has `count` rows (files roll every second)."""
    deadline = time.monotonic() + timeout
    while True:
        done = evagg("query", "--data", str(lake), "tasks", "--name", name, "--json")
        rows: list[dict[str, Any]] = json.loads(done.stdout) if done.returncode == 0 else []
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    agent = AgentProcess(tmp_path_factory.mktemp("newcomer")).start()
    try:
        env = {"EVAGG_SOCKET": str(agent.socket_path)}
        python = subprocess.run([sys.executable, "-c", README_PYTHON], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env},
                                capture_output=True, text=True, timeout=60)
        assert python.returncode == 0, python.stderr
        shell = evagg("emit", "--kind", "task", "--name", "smoke", "--state", "FINISHED", env=env)
        assert shell.returncode == 0, shell.stderr
        agent.wait_delivered(4)
        for name in ("load_shard", "smoke", "reported"):
            assert poll_tasks(agent.lake_dir, name, 1), agent.log()
        yield agent.lake_dir
    finally:
        agent.stop()


def test_the_readme_task_examples_are_tasks_with_their_durations(lake: Path) -> None:
    [shard] = query_json(lake, "tasks", "--name", "load_shard")
    assert shard["final_state"] == "FINISHED" and shard["duration_s"] == 0.8
    assert shard["attempt"] == 0 and shard["task_id"]  # keyed by the event's id
    [smoke] = query_json(lake, "tasks", "--name", "smoke")
    assert smoke["final_state"] == "FINISHED" and smoke["duration_s"] is None
    assert smoke["task_id"] != shard["task_id"]


def test_a_reported_duration_wins_over_the_timestamps(lake: Path) -> None:
    [task] = query_json(lake, "tasks", "--name", "reported")
    assert task["task_id"] == "r1" and task["final_state"] == "FINISHED"
    assert task["duration_s"] == 8.0  # not the microseconds between RUNNING and FINISHED


def test_the_summary_and_the_dashboard_count_them(lake: Path) -> None:
    summary = query_json(lake, "summary")
    names = {r["value"]: r for r in summary if r["dimension"] == "name"}
    assert {"load_shard", "smoke", "reported"} <= set(names)
    assert names["load_shard"]["finished"] == 1 and names["load_shard"]["p50_s"] == 0.8
    assert names["reported"]["max_s"] == 8.0
    with serving(Store(StoreOptions(str(lake), refresh_s=0.0))) as url:
        with urllib.request.urlopen(f"{url}/api/tasks?name=load_shard", timeout=30) as answer:
            page = json.loads(answer.read())
        [row] = page["rows"]
        assert row["duration_s"] == 0.8
        with urllib.request.urlopen(f"{url}/api/task?task_id={row['task_id']}",
                                    timeout=30) as answer:
            detail = json.loads(answer.read())
        assert [e["state"] for e in detail["events"]] == ["FINISHED"]
