"""Real Ray exporting its events to an agent, for the tests that compare what evagg
stored with what Ray says: the environment that turns Ray's Event Export on, a workload
of every kind of task, Ray's own State API once that workload has settled, and a query
over the agent's Parquet lake."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.agentproc import REPO, AgentProcess
from tests.waiting import wait_for

TASKS_SQL = REPO / "dashboard" / "sql" / "tasks.sql"
RAY_EXPORT_ENV = {
    "RAY_enable_core_worker_ray_event_to_aggregator": "1",
    "RAY_enable_ray_event": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # else Ray writes a token into the home directory
}
# The name of tests/test_ray_end_to_end.py's resend test's remote function: it runs in
# the same job as the workload, before or after it (tests run in any order).
OTHER_TESTS_TASK = "tick"


def lake_query(agent: AgentProcess, sql: str) -> list[dict[str, Any]]:
    """Run `sql` over the agent's Parquet lake with the `events_raw` (every stored row),
    `events` and `tasks` views; [] while no file exists yet."""
    if not any(agent.lake_dir.rglob("*.parquet")):
        return []
    con = duckdb.connect()
    con.execute("CREATE VIEW events_raw AS SELECT * FROM read_parquet("
                f"'{agent.lake_dir}/**/*.parquet', hive_partitioning = true, union_by_name = true)")
    con.execute("CREATE VIEW events AS SELECT * FROM events_raw")
    con.execute(TASKS_SQL.read_text())
    table = con.execute(sql).to_arrow_table()
    return [dict(row) for row in table.to_pylist()]


# ---- the workload: plain, failing, nested, retried and actor tasks ------------------------


def run_workload(flag_dir: str) -> dict[str, Any]:
    import ray

    @ray.remote
    def square(x: int) -> int:
        return x * x

    @ray.remote
    def boom(x: int) -> int:
        raise ValueError(f"intentional failure for x={x}")

    @ray.remote
    def outer(n: int) -> tuple[str, int]:
        total = sum(ray.get([square.remote(i) for i in range(n)]))
        return ray.get_runtime_context().get_task_id() or "", total

    @ray.remote(max_retries=2)
    def flaky(flag: str) -> str:
        if not os.path.exists(flag):  # the first attempt dies with its worker
            Path(flag).touch()
            os._exit(1)
        return "recovered"

    @ray.remote
    class Counter:
        def incr(self) -> int:
            return 1

        def fail(self) -> int:
            raise RuntimeError("actor method failure")

    # First: a worker killed mid-task loses the task events it has not flushed yet
    # (Ray flushes every second), such as those of tasks it ran or submitted before.
    assert ray.get(flaky.remote(os.path.join(flag_dir, "flaky.flag"))) == "recovered"
    assert ray.get([square.remote(i) for i in range(3)]) == [0, 1, 4]
    outer_id, total = ray.get(outer.remote(2))
    assert total == 1
    with pytest.raises(ray.exceptions.RayTaskError, match="intentional failure"):
        ray.get(boom.remote(7))
    counter = Counter.remote()  # type: ignore[attr-defined]
    assert ray.get(counter.incr.remote()) == 1
    with pytest.raises(ray.exceptions.RayTaskError, match="actor method failure"):
        ray.get(counter.fail.remote())
    return {"outer_id": outer_id, "attempts": 3 + 1 + 2 + 2 + 1 + 1 + 1 + 1}


def ray_state_tasks(job_id: str, expected: int) -> dict[tuple[str, int], Any]:
    """Ray's own view (State API), once every expected attempt has reached its end."""
    import ray
    from ray.util.state import list_tasks

    # This test's own cluster, by its GCS address: without one, the State API looks for
    # a cluster on the machine and fails when another one runs there too.
    address = ray.get_runtime_context().gcs_address

    def settled() -> dict[tuple[str, int], Any]:  # empty until settled
        tasks = list_tasks(address=address, filters=[("job_id", "=", job_id)], detail=True,
                           limit=1000, raise_on_missing_output=False)
        # The workload's attempts, not another test's in the same job.
        found = {(t.task_id, t.attempt_number): t for t in tasks
                 if t.type != "DRIVER_TASK" and t.name != OTHER_TESTS_TASK}
        done = all(t.state in ("FINISHED", "FAILED") for t in found.values())
        return found if len(found) == expected and done else {}

    return wait_for(settled, 120, "Ray's State API to settle", interval=0.5)
