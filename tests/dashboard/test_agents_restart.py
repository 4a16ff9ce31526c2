"""An agent restarted on its node, as `evagg query agents` reports it from the agent's
own heartbeats in its lake: the counters went down, so a restart is counted and dated,
and the counts print as integers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import emitters
from tests.agentproc import REPO, AgentProcess
from tests.waiting import wait_for

EVENTS = 200


def query_agents(lake: Path, *fmt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(lake),
                           "--no-cache", *fmt, "agents"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def node(lake: Path) -> dict[str, Any] | None:
    """The test agent's row of `evagg query agents --json`; None while there is none."""
    if not any(lake.rglob("*.parquet")):
        return None
    done = query_agents(lake, "--json")
    if done.returncode != 0:
        return None
    rows = [r for r in json.loads(done.stdout) if r["node_id"] == "test-node"]
    return rows[0] if rows else None


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path).start()
    try:
        yield process
    finally:
        process.stop()


def test_a_restarted_agent_is_counted_and_its_counts_are_integers(agent: AgentProcess) -> None:
    emitters.configure(socket=str(agent.socket_path))
    for i in range(EVENTS):
        emitters.emit(kind="task", name="before_restart", state="FINISHED", task_id=f"b{i}")
    assert emitters.flush(10.0)

    def counted() -> dict[str, Any] | None:
        row = node(agent.lake_dir)
        return row if row and row["received_total"] >= EVENTS else None
    before = wait_for(counted, 60, "a heartbeat that counted the events", interval=0.5)
    assert before is not None
    assert before["restarts"] == 0 and before["restarted_at"] is None

    agent.stop()
    agent.start()

    def restarted() -> dict[str, Any] | None:
        row = node(agent.lake_dir)
        return row if row and row["restarts"] >= 1 else None
    after = wait_for(restarted, 60, "a heartbeat of the restarted agent", interval=0.5)
    assert after is not None
    assert after["restarted_at"] > before["last_seen"]
    # each process names its start in its heartbeats: a restart counts whatever the counters
    starts = agent.query("SELECT DISTINCT attrs['started_at'] FROM events WHERE kind = 'agent'")
    assert len(starts) == 2 and all(s for s, in starts), starts
    # dated by when the new agent started, which its heartbeats name, not by the time of
    # its first heartbeat (written as it starts, a moment after that)
    newest = max(datetime.fromisoformat(s) for s, in starts)
    assert after["restarted_at"] == newest.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), (after, starts)
    assert isinstance(after["received_total"], int) and after["received_total"] < EVENTS
    assert after["longest_gap_s"] > 0 and after["heartbeat_interval_s"] == 2

    table = query_agents(agent.lake_dir)
    assert table.returncode == 0, table.stderr
    head, _, row = table.stdout.splitlines()[:3]
    columns = head.split()
    cells = row.split()
    # last_seen is two words (date and time): the cells after it sit one further on
    # (a heartbeat may have come since the JSON: the counts may have grown, not their form)
    for name in ("received_total", "delivered_total", "spool_bytes", "restarts"):
        assert cells[columns.index(name) + 1].isdigit(), (name, table.stdout)
    assert int(cells[columns.index("restarts") + 1]) >= 1
