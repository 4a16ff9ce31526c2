"""A Ray cluster that stopped exports no worker's end: once no agent of its session
reports any more, Ray's own `ray list workers`, asked of `evagg dashboard`, reads every
worker of that cluster dead, as docs/ray.md says, not alive for ever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess
from tests.dashboard.serve import serving
from tests.raycli import ray_list
from tests.rayexport import RAY_EXPORT_ENV
from tests.raylocal import local_ray
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def run_two_tasks() -> None:
    import ray

    @ray.remote
    def double(x: int) -> int:
        return 2 * x

    assert ray.get([double.remote(i) for i in range(4)]) == [0, 2, 4, 6]


def test_ray_list_workers_reads_a_gone_clusters_workers_dead(tmp_path: Path) -> None:
    # Heartbeats every second: the agent counts as silent seconds after it stops.
    agent = AgentProcess(tmp_path, heartbeat_interval="1s").start()
    try:
        env = {**RAY_EXPORT_ENV,
               "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR": f"{agent.http_url}/ray/events"}
        with local_ray(env):
            run_two_tasks()
            agent.wait_rows("SELECT 1 FROM events WHERE kind = 'worker' AND state = 'ALIVE'", 1)
    finally:
        assert agent.stop() == 0
    store = Store(StoreOptions(str(agent.lake_dir), refresh_s=0.5,
                               cache_dir=str(tmp_path / "cache")))
    with serving(store) as url:
        def all_dead() -> list[dict[str, Any]] | None:
            workers = ray_list(url, "workers")
            return workers if workers and not any(w["is_alive"] for w in workers) else None

        workers = wait_for(all_dead, 120, "ray list workers to read the workers dead",
                           interval=2.0)
    # Ray exports the end of a worker it stops itself (an idle one, INTENDED_USER_EXIT);
    # the ones left when the cluster stopped exported none, and are the inferred ones.
    inferred = [w for w in workers if (w["exit_detail"] or "").startswith(
        "evagg inferred this end: no agent of this Ray session has reported since")]
    assert inferred, workers
    for worker in inferred:
        assert worker["exit_type"] == "SYSTEM_ERROR", worker
        assert worker["end_time_ms"], worker
