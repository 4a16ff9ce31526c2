"""An agent is on the dashboard as soon as it is up, not a heartbeat interval later: a
real agent that beats once an hour writes its start heartbeat as it starts, so a new node
is in `evagg query agents` at once, and an agent just restarted shows on the Agents page
(real headless Chromium, 1280 px) as running, not as the STOPPING its predecessor left.

Screenshots go to test-artifacts/dashboard/ (`agent-start-<check>-1280.png`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO, AgentProcess
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving
from tests.waiting import wait_for

HOUR = "1h"  # no periodic heartbeat comes while a test runs: only the start's is there
WAIT_S = 60  # far under the interval: what shows up came with the start


def agents_row(lake: Path) -> dict[str, Any] | None:
    """The test agent's row of `evagg query agents --json`; None while there is none."""
    if not any(lake.rglob("*.parquet")):
        return None
    done = subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(lake),
                           "--no-cache", "--json", "agents"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        return None
    rows = [r for r in json.loads(done.stdout) if r["node_id"] == "test-node"]
    return rows[0] if rows else None


@pytest.fixture
def hourly(agent_factory: Callable[..., AgentProcess]) -> Iterator[AgentProcess]:
    agent = agent_factory(heartbeat_interval=HOUR)
    try:
        yield agent
    finally:
        agent.stop()


def test_a_started_agent_is_in_the_lake_before_its_first_interval(
        hourly: AgentProcess) -> None:
    hourly.start()
    # ready means spooled: the start heartbeat, and no other yet
    assert hourly.metric('evagg_received_events_total{route="agent"}') == 1
    # and a fresh start does not take its own heartbeat for events left from before
    assert "resuming:" not in hourly.log(), hourly.log()
    row = wait_for(lambda: agents_row(hourly.lake_dir), WAIT_S,
                   lambda: f"the new agent's row in `evagg query agents`:\n{hourly.log()}",
                   interval=0.5)
    # one heartbeat, RUNNING, with everything a periodic one holds
    assert (row["state"], row["heartbeats"], row["restarts"]) == ("RUNNING", 1, 0), row
    assert row["heartbeat_interval_s"] == 3600 and row["version"], row
    assert row["silent"] is False and row["silent_after_s"] >= 3 * 3600, row
    assert row["longest_gap_s"] is None and row["restarted_at"] is None, row
    (beat,) = hourly.query("SELECT state, name, attrs['started_at'], attrs['spool'], "
                           "metrics['evagg_spool_bytes'] IS NOT NULL FROM events "
                           "WHERE kind = 'agent'")
    assert beat[:2] == ("RUNNING", "heartbeat") and beat[2] and beat[3] and beat[4], beat


def state_cell(page: Page) -> str:
    """The test node's state on the Agents page, as the page shows it now."""
    page.goto("/#/agents")
    page.reload()  # the hash alone does not load the page again
    row = page.locator("table.grid tbody tr", has_text="test-node")
    row.wait_for()
    return row.locator("td[data-col=state]").inner_text()


def test_the_agents_page_shows_a_just_restarted_agent_as_running(hourly: AgentProcess) -> None:
    hourly.start()
    assert hourly.stop() == 0  # its final heartbeat: STOPPING, delivered by the drain
    stopped = wait_for(lambda: agents_row(hourly.lake_dir), WAIT_S, "the stopped agent's row")
    assert stopped["state"] == "STOPPING", stopped

    hourly.start()  # the node's next agent, as a rollout restarts it
    store = Store(StoreOptions(str(hourly.lake_dir), refresh_s=0))  # every file, each request
    with chromium() as browser, serving(store) as url, \
            tab(browser, url, width=1280, height=900) as page:
        seen: list[str] = []

        def running() -> bool:
            seen.append(state_cell(page))
            return seen[-1] == "RUNNING"
        wait_for(running, WAIT_S, lambda: f"the restarted agent shown running; the page "
                 f"showed {seen[-1]!r}\n{hourly.log()}", interval=0.5)
        row = page.locator("table.grid tbody tr", has_text="test-node")
        page.screenshot(path=str(ARTIFACTS / "agent-start-restarted-1280.png"), full_page=True)
        # the restart is counted and dated, the stop before it is no gap, and the
        # columns fit the page
        restarts = row.locator("td[data-col=restarts]").inner_text()
        assert restarts.startswith("1") and "last " in restarts, restarts
        assert row.locator("td[data-col=state] .error-text").count() == 0
        assert row.locator("td[data-col=longest_gap_s] .error-text").count() == 0
        assert row.locator("td[data-col=heartbeats]").inner_text() == "3"  # start, stop, start
        grid = page.locator("table.grid").first.bounding_box()
        assert grid and grid["x"] + grid["width"] <= page.evaluate("window.innerWidth"), grid
