"""Ray's traced ops on the dashboard's Traces page: a driver's `ray_op` around two
`traced_remote` calls, on a real local Ray cluster through a real agent, listed as one
trace whose waterfall has one row per span (an op's STARTED and FINISHED fold into one),
in real headless Chromium."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

import emitters
from dashboard.lake.store import Store, StoreOptions
from emitters.ray import ray_op, trace_kwargs, traced_remote
from tests.agentproc import AgentProcess
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving
from tests.rayexport import lake_query
from tests.raylocal import local_ray
from tests.waiting import wait_for

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The agent's lake after the workload, and the workload's trace id."""
    agent = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    env = {"EVAGG_SOCKET": str(agent.socket_path), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    emitters.configure(socket=str(agent.socket_path))  # the driver's ops go to this agent
    try:
        with local_ray(env, dashboard=False):
            trace_id = workload()
            emitters.flush(10.0)

            def finished() -> bool:
                rows = lake_query(agent, "SELECT count(*) AS n FROM events WHERE kind = 'op' "
                                         f"AND state = 'FINISHED' AND trace_id = '{trace_id}'")
                return bool(rows) and rows[0]["n"] >= 3
            wait_for(finished, 60, "the traced ops in the agent's lake", interval=0.5)
        yield agent.lake_dir, trace_id
    finally:
        agent.stop()


def workload() -> str:
    import ray

    @ray.remote
    @traced_remote
    def shard(x: int) -> int:
        return x * 2

    with ray_op("epoch", step=0) as epoch:
        ray.get([shard.remote(i, **trace_kwargs()) for i in range(2)])
    assert epoch.context is not None
    return epoch.context.trace_id


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def test_ray_traced_ops_are_listed_and_open_as_one_span_each(lake: tuple[Path, str]) -> None:
    root, trace_id = lake
    store = Store(StoreOptions(str(root), refresh_s=60))
    with serving(store) as url:
        spans = get(f"{url}/api/trace?trace_id={trace_id}")["rows"]
        names = sorted(s["name"] for s in spans)
        assert names[0] == "epoch" and [n.endswith("shard") for n in names[1:]] == [True, True]
        assert len({s["span_id"] for s in spans}) == 3  # STARTED and FINISHED: one row
        # an op has no OTel service: its source (the emitters' own, here) names it
        assert all(s["state"] == "FINISHED" and s["service"] == "evagg" for s in spans), spans
        with chromium() as browser, tab(browser, url, width=1280, height=900) as page:
            page.goto("/#/traces")
            row = page.locator("table.grid tbody tr", has_text=trace_id)
            expect(row).to_contain_text("epoch", timeout=30_000)
            row.locator("a", has_text=trace_id).click()
            expect(page.locator("h2", has_text="Waterfall")).to_have_text(
                "Waterfall (3 spans)", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "ray-traced-ops-1280.png"), full_page=True)
