"""A `ray start` cluster exports a driver job's own end: Ray's `ray list jobs`, asked of
the cluster while it lives and of `evagg dashboard` once it is gone, and `evagg query
jobs`, all say the job ended when Ray's job table says it did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import query_lake
from tests.dashboard.serve import serving
from tests.raycli import ray_list
from tests.rayhead import EXPORT_ENV, ray_head_and_agent
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.slow
EVAGG = str(Path(sys.executable).with_name("evagg"))
DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print(ray.get(ray.remote(lambda: 1).remote()))
"""


def run_driver(address: str, agent_url: str) -> None:
    env = {**os.environ, **EXPORT_ENV, "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR": f"{agent_url}/ray/events"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", DRIVER, address], env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr


def ended_job(url: str) -> dict[str, Any] | None:
    jobs = ray_list(url, "jobs")
    return jobs[0] if len(jobs) == 1 and jobs[0]["status"] == "SUCCEEDED" else None


def job_end_stored(lake: Path) -> bool:
    return any(lake.rglob("*.parquet")) and bool(query_lake(
        lake, "SELECT 1 FROM events WHERE kind = 'job' AND state = 'FINISHED'"))


def test_a_jobs_exported_end_is_the_one_every_tool_reads(tmp_path: Path) -> None:
    with ray_head_and_agent(tmp_path) as (agent, head):
        try:
            run_driver(head.address, agent.http_url)
            theirs = wait_for(lambda: ended_job(head.dashboard_url), 60,
                              "Ray to end the job", interval=1.0)
            wait_until(lambda: job_end_stored(agent.lake_dir), 60,
                       "the job's end in the lake", interval=0.5)
        finally:
            agent.kill()
            shutil.rmtree(head.temp_dir, ignore_errors=True)
    store = Store(StoreOptions(str(agent.lake_dir), refresh_s=0.0,
                               cache_dir=str(tmp_path / "cache")))
    try:
        with serving(store) as url:
            (ours,) = ray_list(url, "jobs")
    finally:
        store.close()
    done = subprocess.run([EVAGG, "query", "--data", str(agent.lake_dir), "--no-cache",
                           "--json", "jobs"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    (view,) = json.loads(done.stdout)
    assert (view["status"], view["how_known"]) == ("SUCCEEDED", "exported by Ray")
    ended = datetime.fromisoformat(view["ended_at"].replace("Z", "+00:00"))
    assert ours["end_time"] == int(ended.timestamp() * 1e6) // 1000
    assert (ours["status"], ours["message"]) == (theirs["status"], theirs["message"])
    # Ray's job table stamps the end a moment before it exports it: a millisecond on a
    # quiet machine, 11 ms seen with both cores busy; a second apart would be another end.
    assert abs(ours["end_time"] - theirs["end_time"]) < 1000, (ours, theirs)
