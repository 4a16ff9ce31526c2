"""Troubled endpoints for bench/bench_http_sink.py --endpoints: the HTTP sink driven by
the agent's real delivery loop (SinkConsumer over a Spool) against a receiver process
that is healthy, fails one request in three, or sheds load with 429s.

The receiver counts requests, batches stored (by Idempotency-Key) and batches stored
more than once (duplicates a receiver would have to drop). The figures compare the
code of one checkout with another: run the script with PYTHONPATH set to the checkout
whose `sinks` and `aggregator` to measure (see bench_http_sink.py).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from aggregator.delivery.consumer import SinkConsumer
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from sinks.http import HttpSink

SCENARIOS = ("healthy", "one_in_three", "shedding")
# One request in three fails, in rotation (a 500, a 429 asking for a second); one in
# twelve takes 2 s to answer 200, within the sink's 10 s timeout.
ROTATION = [(200, 0.0), (200, 0.0), (500, 0.0), (200, 0.0), (200, 2.0), (429, 0.0),
            (200, 0.0), (200, 0.0), (500, 0.0), (200, 0.0), (200, 0.0), (429, 0.0)]
SHEDDING_CAPACITY = 2  # requests the shedding endpoint works on at once; more get a 429
SHEDDING_WORK_S = 0.05  # what each accepted request costs it


def receiver(port: int, scenario: str, ready: Any) -> None:
    """A separate process: answer as `scenario` says; report on GET /stats."""
    stored: Counter[str] = Counter()
    state = {"requests": 0, "turn": 0, "busy": 0}

    async def ingest(request: web.Request) -> web.Response:
        await request.read()
        state["requests"] += 1
        status, delay = 200, 0.0
        if scenario == "one_in_three":
            status, delay = ROTATION[state["turn"] % len(ROTATION)]
            state["turn"] += 1
        elif scenario == "shedding":
            if state["busy"] >= SHEDDING_CAPACITY:
                return web.Response(status=429, headers={"Retry-After": "1"})
            delay = SHEDDING_WORK_S
        state["busy"] += 1
        try:
            if delay:
                await asyncio.sleep(delay)
        finally:
            state["busy"] -= 1
        if status == 200:
            stored[request.headers.get("Idempotency-Key", "")] += 1
        headers = {"Retry-After": "1"} if status == 429 else {}
        return web.Response(status=status, headers=headers)

    async def report(request: web.Request) -> web.Response:
        payload = web.json_response({
            "requests": state["requests"], "batches": len(stored),
            "duplicates": sum(n - 1 for n in stored.values())})
        stored.clear()
        state.update(requests=0, turn=0)
        return payload

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/ingest", ingest)
    app.router.add_get("/stats", report)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def make_sink(url: str, **options: Any) -> HttpSink:
    """The sink with these options, from a checkout before or after HttpOptions."""
    try:
        from sinks.http import HttpOptions  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # the keyword-argument constructor of earlier checkouts
        return HttpSink("bench", url, spool_id="bench", **options)  # type: ignore[arg-type,unused-ignore]
    return HttpSink("bench", url, HttpOptions(**options), spool_id="bench")


@dataclass
class Run:
    events: int
    delivered_events: int
    seconds: float
    cpu_s: float

    @property
    def done(self) -> bool:
        return self.delivered_events >= self.events


async def through_loop(url: str, payloads: list[bytes], records: int, per_record: int,
                       limit_s: float) -> Run:
    """Spool `records` records, deliver them with a SinkConsumer; stop at `limit_s`."""
    with tempfile.TemporaryDirectory() as tmp:
        spool = Spool(Path(tmp) / "spool", max_bytes=1 << 31)
        spool.open()
        spool.register_sinks(["bench"])
        for i in range(records):
            await spool.append(payloads[i % len(payloads)], per_record, received_ns=i)
        sink = make_sink(url, batch_max_events=per_record)
        metrics = AgentMetrics()
        consumer = SinkConsumer(sink, spool, metrics, read_max_bytes=sink.read_max_bytes,
                                backoff_cap_s=60.0)
        started, cpu = time.perf_counter(), time.process_time()
        task = asyncio.create_task(consumer.run())
        while (spool.cursor("bench") < spool.next_offset
               and time.perf_counter() - started < limit_s):
            await asyncio.sleep(0.01)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        consumer.stop()
        await asyncio.wait({task}, timeout=15)
        task.cancel()
        await consumer.close()
        delivered = int(metrics.delivered_events.get(sink="bench"))
        spool.close()
    return Run(records * per_record, delivered, seconds, cpu)


def table_line(scenario: str, run: Run, stats: dict[str, int], batches: int) -> str:
    done = "" if run.done else f"  (stopped at {run.seconds:.0f}s: "
    done += "" if run.done else f"{run.delivered_events:,} of {run.events:,} delivered)"
    cpu = (f"{run.cpu_s / run.delivered_events * 1e6:>10.2f}" if run.delivered_events
           else f"{'-':>10}")
    return (f"{scenario:<14} {run.delivered_events / run.seconds:>10,.0f} {run.seconds:>8.1f}"
            f" {stats['requests'] / batches:>9.2f} {stats['duplicates']:>10} {cpu}{done}")


TABLE_HEAD = (f"{'endpoint':<14} {'events/s':>10} {'seconds':>8} {'req/batch':>9}"
              f" {'duplicates':>10} {'CPU us/ev':>10}")


def checkout() -> str:
    """Which checkout's code this process runs (for the table's title)."""
    import sinks

    return str(Path(sinks.__file__).resolve().parents[1].name or os.getcwd())
