"""Ray Event Export ingest: 1000-event POST bodies (the Ray >= 2.56 batch size, ~0.9 MB)
through parse, dedupe, mapping and Arrow conversion on one core, stage by stage side by
side; then, with --start-agent or --url, POSTed to a running agent's /ray/events one at a
time (as Ray sends them) for the end-to-end latency.

Bodies are built from the captured Ray 2.60 shapes in tests/fixtures/ray with fresh ids
and times: per task a TASK_DEFINITION_EVENT, the owner's lifecycle event (4 transitions)
and the executor's RUNNING event; one task in 50 fails with a traceback.

    .venv/bin/python bench/bench_ray_ingest.py [--seconds 3] [--events 1000] [--start-agent]
"""

from __future__ import annotations

import argparse
import base64
import copy
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402

from aggregator.normalize import Stamp, rows_to_batch  # noqa: E402
from aggregator.ray_events import RecentEventIds, parse_ray_body, ray_events_to_rows  # noqa: E402
from emitters.fields import EVENT_FIELDS  # noqa: E402
from sinks.schema import EVENT_SCHEMA  # noqa: E402

SAMPLE = REPO / "tests" / "fixtures" / "ray" / "02_excerpt_task_lifecycle_normal_and_failed.json"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _stamp(ns: int) -> str:
    seconds, nanos = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


class BodyMaker:
    """Ray-shaped bodies with new eventIds, taskIds, workers and times every time."""

    def __init__(self) -> None:
        events = json.loads(SAMPLE.read_text())["events"]
        for event in events:
            event.pop("_captured_in", None)
        self.running, _, self.definition, self.owner, _, self.failed = events
        self.now = time.time_ns()
        self.count = 0

    def task(self) -> list[dict[str, Any]]:
        self.count += 1
        task_id = _b64(os.urandom(8) + b"\xff" * 12 + b"\x01\x00\x00\x00")
        worker_id = _b64(os.urandom(28))
        owner = self.failed if self.count % 50 == 0 else self.owner
        out = []
        for template in (self.definition, owner, self.running):
            event = copy.deepcopy(template)
            event["eventId"] = _b64(os.urandom(28))
            payload = event.get("taskLifecycleEvent") or event["taskDefinitionEvent"]
            payload["taskId"] = task_id
            if payload.get("workerId"):
                payload["workerId"] = worker_id
            for transition in payload.get("stateTransitions", []):
                self.now += 37_000
                transition["timestamp"] = _stamp(self.now)
            event["timestamp"] = _stamp(self.now)
            out.append(event)
        return out

    def body(self, events: int) -> bytes:
        items: list[dict[str, Any]] = []
        while len(items) < events:
            items.extend(self.task())
        return json.dumps(items[:events]).encode()  # Ray's own spacing


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_stages(bodies: list[bytes], events: int, seconds: float) -> None:
    stamp = Stamp.now("bench-node")
    recent = RecentEventIds()

    def parse(body: bytes) -> Any:
        return parse_ray_body(body)

    def dedupe(body: bytes) -> Any:
        items = parse_ray_body(body)
        fresh = [i for i, new in zip(items, recent.filter_new(items), strict=True) if new]
        recent.confirm(fresh)
        return fresh

    def mapped(body: bytes) -> Any:
        return ray_events_to_rows(dedupe(body))

    def full(body: bytes) -> Any:
        rows, _ = mapped(body)
        return rows_to_batch(rows, stamp)

    def direct(body: bytes) -> Any:
        rows, _ = mapped(body)
        return direct_batch(rows, stamp)

    rows_per_body = len(ray_events_to_rows(parse_ray_body(bodies[0]))[0])
    size_kb = sum(map(len, bodies)) / len(bodies) / 1024
    print(f"bodies: {events} Ray events, {rows_per_body} rows, {size_kb:,.0f} KiB each; "
          f"one core, {seconds:.0f} s per stage")
    for name, stage in (("parse (orjson)", parse), ("+ dedupe", dedupe),
                        ("+ map to rows", mapped), ("+ rows_to_batch", full),
                        ("+ direct Arrow *", direct)):
        recent = RecentEventIds()
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        index = 0
        while time.perf_counter() < deadline or len(latencies) < 5:
            body = bodies[index % len(bodies)]
            if index and index % len(bodies) == 0:
                recent = RecentEventIds()  # the same bodies again: not duplicates here
            latencies.append(_timed(functools.partial(stage, body)))
            index += 1
        _report(name, latencies, events)
    print("  * a prototype, not the agent's path: rows straight into Arrow columns, trusting\n"
          "    the mapper's types instead of normalize.rows_to_batch's per-field checks")


def direct_batch(rows: list[dict[str, Any]], stamp: Stamp) -> pa.RecordBatch:
    columns = {name: [row.get(name) for row in rows] for name in EVENT_FIELDS}
    count = len(rows)
    columns["pid"], columns["uid"] = [stamp.pid] * count, [stamp.uid] * count
    columns["received"] = [stamp.received_ns] * count
    columns["host"] = [stamp.host or None] * count
    columns["attrs"] = [list(a.items()) if a else None for a in columns["attrs"]]
    return pa.RecordBatch.from_pydict(columns, schema=EVENT_SCHEMA)


def _report(name: str, latencies: list[float], events: int) -> None:
    total = sum(latencies)
    p50 = statistics.median(latencies) * 1e3
    p99 = statistics.quantiles(latencies, n=100)[98] * 1e3 if len(latencies) >= 100 \
        else max(latencies) * 1e3
    print(f"  {name:<18} {len(latencies) / total:>8,.1f} batches/s "
          f"{len(latencies) * events / total:>10,.0f} Ray events/s  "
          f"p50 {p50:>6.2f} ms  p99 {p99:>6.2f} ms")


def bench_post(url: str, maker: BodyMaker, events: int, seconds: float) -> None:
    bodies = [maker.body(events) for _ in range(max(8, int(seconds * 20)))]
    latencies: list[float] = []
    for body in bodies:
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
        latencies.append(time.perf_counter() - start)
    _report("POST to agent", latencies, events)
    resend = bodies[-1]
    request = urllib.request.Request(url, data=resend, method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
    print(f"  {'resent body':<18} {(time.perf_counter() - start) * 1e3:>6.2f} ms (all duplicates)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--url", help="a running agent's /ray/events URL")
    parser.add_argument("--start-agent", action="store_true",
                        help="start an agent (Parquet sink in a temp dir) and POST to it")
    args = parser.parse_args()
    maker = BodyMaker()
    bench_stages([maker.body(args.events) for _ in range(16)], args.events, args.seconds)
    if args.start_agent:
        from tests.agentproc import AgentProcess

        with tempfile.TemporaryDirectory(prefix="evagg-bench-") as workdir:
            agent = AgentProcess(Path(workdir)).start()
            try:
                bench_post(f"{agent.http_url}/ray/events", maker, args.events, args.seconds)
            finally:
                agent.stop()
    elif args.url:
        bench_post(args.url, maker, args.events, args.seconds)


if __name__ == "__main__":
    main()
