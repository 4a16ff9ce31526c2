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
from sinks.parquet.layout import EVENT_GLOB


def demo_run_id() -> str:
    """Each demo is a run of its own, so that its table shows only its own events."""
    return time.strftime("demo-%Y%m%d-%H%M%S")


def produce_demo_events(socket_path: str, events: int, run_id: str = "demo-run") -> bool:
    """A small training run: steps of forward/backward/optimizer ops, and some tasks."""
    from emitters import Emitter

    emitter = Emitter(socket=socket_path, run_id=run_id, job_id="demo-job", source="demo")
    steps = max(1, events // 8)
    for step in range(steps):
        for name in ("forward", "backward", "optimizer.step"):
            with emitter.op(name, step=step) as op:
                if name == "forward":
                    op.metric(loss=math.exp(-step / 50) + random.random() * 0.05)
        task_id = f"{run_id}-task-{step}"  # each demo's tasks its own, like its run
        duration_s = random.uniform(0.01, 0.2)
        # Started `duration_s` before it ended, both times stated, so the tasks view's time
        # between states is the duration it reports, however the machine schedules this.
        ended_ns = time.time_ns()
        emitter.emit(kind="task", name="preprocess", state="RUNNING", task_id=task_id,
                     time=ended_ns - int(duration_s * 1e9))
        failed = step % 17 == 16
        emitter.emit(kind="task", name="preprocess", state="FAILED" if failed else "FINISHED",
                     task_id=task_id, duration_s=duration_s, time=ended_ns,
                     error_type="ValueError" if failed else None,
                     error_message="bad shard" if failed else None)
    ok = emitter.flush(10.0)
    emitter.close()
    return ok


async def _demo(config: AgentConfig, events: int, run_id: str) -> int:
    agent = Agent(config)
    running = asyncio.create_task(agent.run())
    while not agent.is_ready():
        if running.done():
            return running.result()
        await asyncio.sleep(0.05)
    try:
        ok = await asyncio.to_thread(produce_demo_events, str(config.socket), events, run_id)
    finally:
        agent.request_stop()  # drain even if the demo producer failed
    code = await running
    return code if ok else 1


def run_demo(config: AgentConfig, events: int) -> int:
    run_id = demo_run_id()
    code = asyncio.run(_demo(config, events, run_id))
    if code != 0:
        return code
    lake = next((s.url for s in config.sinks if s.type == "parquet"), None)
    if lake is None:
        return 0
    _show(lake, run_id)
    return 0


def _show(lake: str, run_id: str) -> None:
    import duckdb

    # Only this demo's run: the agent's own heartbeats and earlier demos are in the same
    # files. Ops take microseconds and tasks tenths of a second: one unit would not do.
    # The layout's glob, not `**` (sinks/parquet/layout.py): the printed SQL is what a
    # newcomer copies.
    sql = ("SELECT kind, name, state, count(*) AS events,\n"
           "       CASE WHEN avg(duration_s) < 0.001 "
           "THEN printf('%.1f µs', avg(duration_s) * 1e6)\n"
           "            ELSE printf('%.1f ms', avg(duration_s) * 1e3) END AS avg_duration\n"
           f"FROM read_parquet('{lake}/{EVENT_GLOB}', "
           "hive_partitioning = true)\n"
           f"WHERE run_id = '{run_id}'\n"
           "GROUP BY ALL ORDER BY kind, name, state")
    print(f"\nParquet written under {lake} (this demo is run {run_id}; earlier runs "
          f"stay there too)\nQuery it with DuckDB:\n\n{sql};\n")
    print(duckdb.sql(sql))
    print("The demo's ops do no work and are timed for real, so they take a few "
          "microseconds\nor less; its preprocess tasks report made-up durations of 10 to "
          "200 ms.")
    print(_left_behind(lake))


def _left_behind(lake: str) -> str:
    """What stays after the demo, said once: its events share the default store with
    whatever the agent stores next, and nothing removes them by itself."""
    # The path on a line of its own: it is as long as the home directory makes it, so a
    # sentence wrapped around it breaks at odd places.
    return (f"\nThe demo's events stay in\n  {lake}\nbeside the events you send next: "
            "evagg query and the dashboard count them too\n(source 'demo'). To clear them "
            f"while nothing of yours is there yet:\n  rm -r {lake}\nor leave them out of "
            "your own SQL with WHERE source <> 'demo'.")



