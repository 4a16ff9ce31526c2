"""`evagg run --demo`: the agent on the embedded default, a short producer, then the query.

It shows a newcomer the whole path in one command: emitter -> socket -> spool -> Parquet
-> DuckDB, and prints the SQL to run again by hand.
"""

from __future__ import annotations

import asyncio
import math
import random
import time

from aggregator.agent import Agent
from aggregator.config import AgentConfig


def produce_demo_events(socket_path: str, events: int) -> bool:
    """A small training run: steps of forward/backward/optimizer ops, and some tasks."""
    from emitters import Emitter

    emitter = Emitter(socket=socket_path, run_id="demo-run", job_id="demo-job", source="demo")
    steps = max(1, events // 8)
    for step in range(steps):
        for name in ("forward", "backward", "optimizer.step"):
            with emitter.op(name, step=step) as op:
                if name == "forward":
                    op.metric(loss=math.exp(-step / 50) + random.random() * 0.05)
        task_id = f"demo-task-{step}"
        duration_s = random.uniform(0.01, 0.2)
        # Started `duration_s` ago, so the tasks view's time between states agrees with it.
        emitter.emit(kind="task", name="preprocess", state="RUNNING", task_id=task_id,
                     time=time.time_ns() - int(duration_s * 1e9))
        failed = step % 17 == 16
        emitter.emit(kind="task", name="preprocess", state="FAILED" if failed else "FINISHED",
                     task_id=task_id, duration_s=duration_s,
                     error_type="ValueError" if failed else None,
                     error_message="ValueError: bad shard" if failed else None)
    ok = emitter.flush(10.0)
    emitter.close()
    return ok


async def _demo(config: AgentConfig, events: int) -> int:
    agent = Agent(config)
    running = asyncio.create_task(agent.run())
    while not agent.is_ready():
        if running.done():
            return running.result()
        await asyncio.sleep(0.05)
    try:
        ok = await asyncio.to_thread(produce_demo_events, str(config.socket), events)
    finally:
        agent.request_stop()  # drain even if the demo producer failed
    code = await running
    return code if ok else 1


def run_demo(config: AgentConfig, events: int) -> int:
    code = asyncio.run(_demo(config, events))
    if code != 0:
        return code
    lake = next((s.url for s in config.sinks if s.type == "parquet"), None)
    if lake is None:
        return 0
    _show(lake)
    return 0


def _show(lake: str) -> None:
    import duckdb

    sql = ("SELECT kind, name, state, count(*) AS events,\n"
           "       round(avg(duration_s) * 1000, 3) AS avg_ms\n"
           f"FROM read_parquet('{lake}/**/*.parquet', hive_partitioning = true)\n"
           f"GROUP BY ALL ORDER BY kind, name, state")
    print(f"\nParquet written under {lake}\nQuery it with DuckDB:\n\n{sql};\n")
    print(duckdb.sql(sql))



