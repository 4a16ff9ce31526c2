"""Ray Event Export ingest: 1000-event POST bodies (the Ray >= 2.56 batch size, ~0.9 MB)
on one core, stage by stage side by side: the reference path (parse, dedupe, map to row
dicts, `normalize.rows_to_batch`) and the agent's columnar path (`aggregator.ray.batch`), with the
wall rate and the CPU time per Ray event; then, with --start-agent or --url, POSTed to a
running agent's /ray/events one at a time (as Ray sends them) for the answer's latency,
and with --start-agent the agent process's own CPU time per Ray event: once while its
Parquet sink writes the events, once with its one sink down (POST -> spool only).

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

from aggregator.decode.normalize import Stamp, rows_to_batch  # noqa: E402
from aggregator.ray.batch import ray_body_to_batch  # noqa: E402
from aggregator.ray.events import RecentEventIds, parse_ray_body, ray_events_to_rows  # noqa: E402
from sinks.schema import batch_to_bytes  # noqa: E402

SAMPLE = REPO / "tests" / "fixtures" / "ray" / "02_excerpt_task_lifecycle_normal_and_failed.json"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _stamp(ns: int) -> str:
    """As protobuf prints a Timestamp: 0, 3, 6 or 9 fraction digits."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if nanos == 0:
        return whole + "Z"
    fraction = f".{nanos:09d}"
    while fraction.endswith("000"):
        fraction = fraction[:-3]
    return whole + fraction + "Z"


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


def _pyarrow_json_reader() -> Callable[[bytes], Any]:
    """pyarrow's compiled JSON reader with an explicit schema of the bench's event shapes,
    the other reader the issue names: what parsing a body into typed Arrow columns costs
    before any id is decoded, any row made or anything checked. It reads NDJSON only, so
    the body's array becomes the one row of a list column; its `map` type is refused, so
    the fields that need one (`requiredResources`, `refIds`, `labelSelector`) are left out."""
    import io

    import pyarrow as pa
    import pyarrow.json as pj

    text = pa.string()
    stamp = pa.timestamp("ns", "UTC")
    transition = pa.struct([("state", text), ("timestamp", stamp)])
    lifecycle = pa.struct([
        ("taskId", text), ("stateTransitions", pa.list_(transition)), ("jobId", text),
        ("taskAttempt", pa.int64()), ("nodeId", text), ("workerId", text),
        ("workerPid", pa.int64()),
        ("rayErrorInfo", pa.struct([("errorMessage", text), ("errorType", text)]))])
    descriptor = pa.struct([(name, text) for name in
                            ("moduleName", "className", "functionName", "functionHash")])
    definition = pa.struct([
        ("taskId", text), ("taskFunc", pa.struct([("pythonFunctionDescriptor", descriptor)])),
        ("taskName", text), ("jobId", text), ("parentTaskId", text),
        ("placementGroupId", text), ("serializedRuntimeEnv", text),
        ("taskAttempt", pa.int64()), ("language", text), ("taskType", text)])
    event = pa.struct([
        ("eventId", text), ("sourceType", text), ("eventType", text), ("timestamp", stamp),
        ("severity", text), ("sessionName", text), ("taskLifecycleEvent", lifecycle),
        ("taskDefinitionEvent", definition), ("nodeId", text), ("message", text)])
    options = pj.ParseOptions(explicit_schema=pa.schema([("events", pa.list_(event))]),
                              unexpected_field_behavior="ignore")

    def read(body: bytes) -> Any:
        line = b'{"events":' + body + b"}"
        return pj.read_json(io.BytesIO(line), parse_options=options, read_options=pj.ReadOptions(
            block_size=len(line) + 1, use_threads=False))

    return read


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

    def reference(body: bytes) -> Any:
        rows, _ = mapped(body)
        return batch_to_bytes(rows_to_batch(rows, stamp).batch)

    def columnar(body: bytes) -> Any:
        result = ray_body_to_batch(body, recent, stamp)
        recent.confirm(result.fresh_ids)
        return batch_to_bytes(result.batch)

    first = ray_body_to_batch(bodies[0], RecentEventIds(), stamp)
    size_kb = sum(map(len, bodies)) / len(bodies) / 1024
    print(f"bodies: {events} Ray events, {first.batch.num_rows} rows, {size_kb:,.0f} KiB "
          f"each ({first.careful} events on the careful path); one core, {seconds:.0f} s "
          "per stage")
    for name, stage in (("parse (orjson)", parse),
                        ("parse (pyarrow json)", _pyarrow_json_reader()),
                        ("+ dedupe", dedupe),
                        ("+ map to rows", mapped), ("+ rows_to_batch", reference),
                        ("columnar (agent)", columnar)):
        recent = RecentEventIds()
        latencies: list[float] = []
        cpu = time.process_time()
        deadline = time.perf_counter() + seconds
        index = 0
        while time.perf_counter() < deadline or len(latencies) < 5:
            body = bodies[index % len(bodies)]
            if index and index % len(bodies) == 0:
                recent = RecentEventIds()  # the same bodies again: not duplicates here
            latencies.append(_timed(functools.partial(stage, body)))
            index += 1
        cpu_us = (time.process_time() - cpu) / (len(latencies) * events) * 1e6
        _report(name, latencies, events, f"  cpu {cpu_us:5.2f} us/event")
    print("  (+ rows_to_batch and columnar include the Arrow IPC bytes the spool stores;\n"
          "   pyarrow json is a typed parse alone, beside orjson's, not a stage of the path)")


def _report(name: str, latencies: list[float], events: int, extra: str = "") -> None:
    total = sum(latencies)
    p50 = statistics.median(latencies) * 1e3
    p99 = statistics.quantiles(latencies, n=100)[98] * 1e3 if len(latencies) >= 100 \
        else max(latencies) * 1e3
    print(f"  {name:<22} {len(latencies) / total:>8,.1f} batches/s "
          f"{len(latencies) * events / total:>10,.0f} Ray events/s  "
          f"p50 {p50:>6.2f} ms  p99 {p99:>6.2f} ms{extra}")


def bench_post(url: str, maker: BodyMaker, events: int, seconds: float,
               agent_cpu: Callable[[], float] | None = None,
               label: str = "POST to agent") -> None:
    bodies = [maker.body(events) for _ in range(max(8, int(seconds * 20)))]
    latencies: list[float] = []
    cpu = agent_cpu() if agent_cpu else 0.0
    for body in bodies:
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
        latencies.append(time.perf_counter() - start)
    extra = ""
    if agent_cpu:  # all of the agent's threads, its sink's work included
        cpu_us = (agent_cpu() - cpu) / (len(bodies) * events) * 1e6
        extra = f"  agent cpu {cpu_us:5.2f} us/event"
    _report(label, latencies, events, extra)
    resend = bodies[-1]
    request = urllib.request.Request(url, data=resend, method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
    print(f"  {'resent body':<22} {(time.perf_counter() - start) * 1e3:>6.2f} ms (all duplicates)")


def process_cpu(pid: int) -> Callable[[], float] | None:
    """CPU seconds (user + system) of a process, from Linux's /proc; None elsewhere."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        return None

    def seconds() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    return seconds


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
        from tests.ports import free_port

        # The figure is POST -> spool; the agent also writes Parquet meanwhile
        # unless its one sink is down (an HTTP sink to a closed port backs off quietly).
        down = (f'[[sinks]]\nname = "down"\ntype = "http"\n'
                f'url = "http://127.0.0.1:{free_port()}/"\n')
        for label, sinks in (("POST, spool + Parquet", ""), ("POST, spool only", down)):
            with tempfile.TemporaryDirectory(prefix="evagg-bench-") as workdir:
                agent = AgentProcess(Path(workdir), sinks_toml=sinks,
                                     spool_toml='max_bytes = "8GiB"').start()
                assert agent.proc is not None
                try:
                    bench_post(f"{agent.http_url}/ray/events", maker, args.events,
                               args.seconds, process_cpu(agent.proc.pid), label)
                finally:
                    agent.stop()
    elif args.url:
        bench_post(args.url, maker, args.events, args.seconds)


if __name__ == "__main__":
    main()
