"""HTTP sink throughput: spool records of 1000 events through HttpSink to a local receiver.

The receiver is an aiohttp server in a separate process that reads each body and
counts events. For each body format the script prints events/s and MB/s end to end,
and, side by side, the parts: Arrow -> JSON encoding alone, gzip alone, and POSTing
ready bodies alone, so it is clear where the time goes. CPU us/ev is the sending
process's CPU time (all threads) per event: steadier than events/s on a shared machine.
Each line is the best of --repeat runs.

With --endpoints it instead delivers --records records through the agent's delivery
loop to a healthy endpoint, one failing a request in three and one shedding load with
429s (bench/http_endpoints.py): events/s, requests per batch, batches the receiver
stored twice, CPU per event. To compare with earlier code, run the same script against
a worktree of it: `git worktree add ../before <commit>`, then
`PYTHONPATH=../before .venv/bin/python bench/bench_http_sink.py --endpoints`.

    .venv/bin/python bench/bench_http_sink.py [--events 300000] [--in-flight 4]
    .venv/bin/python bench/bench_http_sink.py --endpoints [--records 20]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
import uuid
from typing import Any

import aiohttp
import pyarrow as pa
from aiohttp import web
from http_endpoints import (
    SCENARIOS,
    TABLE_HEAD,
    checkout,
    make_sink,
    table_line,
    through_loop,
)
from http_endpoints import receiver as scenario_receiver

from sinks.http.batches import frame_body, gzip_body
from sinks.http.body import encode_rows
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_from_bytes, batch_to_bytes

PER_RECORD = 1000
RECORDS_PER_WRITE = 16  # the delivery loop hands a sink several records per call


def make_payloads(count: int) -> list[bytes]:
    """Distinct records of 1000 events of about 400 bytes of JSON each (op and task events
    of a training job: ids, names, step, duration, two metrics, one label)."""
    payloads = []
    t0 = time.time_ns()
    for r in range(count):
        rows = []
        for i in range(PER_RECORD):
            n = r * PER_RECORD + i
            rows.append({
                "event_id": str(uuid.UUID(bytes=os.urandom(16))), "time": t0 + n * 1000,
                "kind": ("task", "op")[n % 2], "source": ("ray", "torch")[n % 2],
                "name": f"train_step_{n % 13}", "state": ("RUNNING", "FINISHED")[n % 2],
                "task_id": os.urandom(12).hex(), "job_id": "02000000", "run_id": "run-7",
                "node_id": "node-0a1b2c", "host": "gpu-host-17", "pid": 4242, "uid": 1000,
                "step": n, "duration_s": (n % 997) / 1000,
                "metrics": [("loss", 1 / (n + 1)), ("lr", 3e-4)], "attrs": [("rank", str(n % 8))],
                "received": t0 + n * 1000 + 5,
            })
        payloads.append(batch_to_bytes(pa.RecordBatch.from_pylist(rows, schema=EVENT_SCHEMA)))
    return payloads


def receiver(port: int, ready: Any) -> None:
    """A separate process: accept POSTs, count events and bytes, report on GET /stats."""
    stats = {"events": 0, "bytes": 0, "requests": 0}

    async def ingest(request: web.Request) -> web.Response:
        body = await request.read()
        stats["requests"] += 1
        stats["bytes"] += len(body)
        if request.content_type == "application/json":
            stats["events"] += body.count(b'{"event_id"')
        else:
            stats["events"] += body.count(b"\n")
        return web.Response(status=200)

    async def report(request: web.Request) -> web.Response:
        payload = web.json_response(dict(stats))
        stats.update(events=0, bytes=0, requests=0)
        return payload

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/ingest", ingest)
    app.router.add_get("/stats", report)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


Outcome = tuple[float, float, dict[str, int], dict[str, int]]


async def end_to_end(url: str, payloads: list[bytes], total: int, body_format: str,
                     gzip: bool, in_flight: int) -> Outcome:
    sink = make_sink(url, body_format=body_format, gzip=gzip, max_in_flight=in_flight,
                     batch_max_events=PER_RECORD)
    records = [SpoolRecord(i + 1, bytes(16), i, 0, PER_RECORD, payloads[i % len(payloads)])
               for i in range(total // PER_RECORD)]
    started, cpu = time.perf_counter(), time.process_time()
    for at in range(0, len(records), RECORDS_PER_WRITE):
        result = await sink.write(records[at : at + RECORDS_PER_WRITE])
        assert result.ok, result
    result = await sink.flush(final=True)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert result.ok and result.durable_through == records[-1].offset, result
    metrics = sink.metrics()
    await sink.close()
    async with aiohttp.ClientSession() as session, session.get(url.replace("ingest", "stats")) as r:
        stats = await r.json()
    return elapsed, cpu, metrics, stats


def encode_only(payloads: list[bytes], total: int) -> tuple[float, float, int, list[bytes]]:
    tables = [pa.Table.from_batches([batch_from_bytes(p)]) for p in payloads]
    bodies: list[bytes] = []
    size = 0
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(0, total // PER_RECORD, RECORDS_PER_WRITE):
        group = [tables[(i + j) % len(tables)] for j in range(RECORDS_PER_WRITE)]
        for chunk in encode_rows(pa.concat_tables(group)):
            size += len(chunk.data)
            for first in range(0, len(chunk) - PER_RECORD + 1, PER_RECORD):
                if len(bodies) < 16:
                    body = frame_body([chunk.rows(first, first + PER_RECORD)], "ndjson")
                    bodies.append(bytes(body))
    return time.perf_counter() - started, time.process_time() - cpu, size, bodies


async def post_only(url: str, bodies: list[bytes], requests: int,
                    in_flight: int) -> tuple[float, float]:
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:
        semaphore = asyncio.Semaphore(in_flight)

        headers = {"Content-Type": "application/x-ndjson"}

        async def post(i: int) -> None:
            body = bodies[i % len(bodies)]
            async with semaphore, session.post(url, data=body, headers=headers) as r:
                await r.read()

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(post(i) for i in range(requests)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        async with session.get(url.replace("ingest", "stats")) as r:
            await r.read()
    return elapsed, cpu


def line(label: str, events: int, seconds: float, json_bytes: int, wire_bytes: int,
         cpu: float) -> str:
    return (f"{label:<34} {events / seconds:>12,.0f} {json_bytes / seconds / 1e6:>10,.1f}"
            f" {wire_bytes / seconds / 1e6:>10,.1f} {cpu / events * 1e6:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=320_000)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2, help="runs per line; the best is shown")
    parser.add_argument("--endpoints", action="store_true",
                        help="troubled endpoints through the delivery loop instead")
    parser.add_argument("--records", type=int, default=20, help="with --endpoints")
    parser.add_argument("--limit", type=float, default=180.0,
                        help="with --endpoints: seconds a scenario may take at most")
    args = parser.parse_args()
    if args.endpoints:
        endpoints(args.records, args.limit)
        return
    total = args.events - args.events % (PER_RECORD * RECORDS_PER_WRITE)
    port = 18_000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}/ingest"
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=receiver, args=(port, ready), daemon=True)
    server.start()
    ready.wait(10)
    time.sleep(0.5)
    try:
        payloads = make_payloads(24)
        print(f"{total:,} events in records of {PER_RECORD}, batches of {PER_RECORD}, "
              f"{args.in_flight} in flight, {os.cpu_count()} CPUs")
        print(f"{'':<34} {'events/s':>12} {'JSON MB/s':>10} {'wire MB/s':>10}"
              f" {'CPU us/ev':>10}")
        runs = [encode_only(payloads, total) for _ in range(args.repeat)]
        seconds, cpu, size, bodies = min(runs, key=lambda run: run[0])
        print(line("encode only (Arrow -> NDJSON)", total, seconds, size, 0, cpu))
        print(f"{'':<34} ({size / total:.0f} bytes of JSON per event)")
        started, cpu = time.perf_counter(), time.process_time()
        zipped = sum(len(gzip_body(b)) for b in bodies)
        scale = total / (PER_RECORD * len(bodies))  # bodies of 1000 events each
        seconds, cpu = (time.perf_counter() - started) * scale, (time.process_time() - cpu) * scale
        print(line("gzip only (level 1, one thread)", total, seconds, size, int(zipped * scale),
                   cpu))
        seconds, cpu = min(asyncio.run(post_only(url, bodies, total // PER_RECORD, args.in_flight))
                           for _ in range(args.repeat))
        print(line("POST ready bodies only", total, seconds, size, size, cpu))
        for body_format, gzip in (("ndjson", False), ("json", False), ("ndjson", True)):
            label = f"HttpSink {body_format}{' + gzip' if gzip else ''}"
            seconds, cpu, metrics, stats = min(
                (asyncio.run(end_to_end(url, payloads, total, body_format, gzip, args.in_flight))
                 for _ in range(args.repeat)), key=lambda run: run[0])
            assert stats["events"] == total, (stats, total)
            print(line(label, total, seconds, stats["bytes"], metrics["bytes_sent"], cpu))
    finally:
        server.terminate()
        server.join(5)


def endpoints(records: int, limit_s: float) -> None:
    payloads = make_payloads(8)
    print(f"code of {checkout()}: {records} records of {PER_RECORD} events, one batch "
          f"each, default sink options, {os.cpu_count()} CPUs")
    print(TABLE_HEAD)
    for scenario in SCENARIOS:
        port = 18_000 + (os.getpid() + SCENARIOS.index(scenario) + 1) % 1000
        url = f"http://127.0.0.1:{port}/ingest"
        ready = multiprocessing.Event()
        server = multiprocessing.Process(target=scenario_receiver,
                                         args=(port, scenario, ready), daemon=True)
        server.start()
        ready.wait(10)
        time.sleep(0.5)
        try:
            run = asyncio.run(through_loop(url, payloads, records, PER_RECORD, limit_s))
            stats = asyncio.run(_stats(url))
            print(table_line(scenario, run, stats, records), flush=True)
        finally:
            server.terminate()
            server.join(5)


async def _stats(url: str) -> dict[str, int]:
    async with aiohttp.ClientSession() as session, session.get(url.replace("ingest", "stats")) as r:
        stats: dict[str, int] = await r.json()
    return stats


if __name__ == "__main__":
    main()
