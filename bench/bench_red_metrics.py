"""Ingest cost with and without the RED metrics derivation, side by side.

    .venv/bin/python bench/bench_red_metrics.py [--rounds 5] [--e2e-events 200000]

1. The decode path the agent runs per frame, in one thread: `decode_ndjson` + spool payload
   (`batch_to_bytes`), against the same plus `RedMetrics.add_batch` and its flushes
   (every 4096 rows: `measure` + `add`), in CPU time of the thread (`time.thread_time`),
   so that other processes on the machine do not count. Frames of 100 and 1000
   emitter-shaped events (50 op/task names, states STARTED/FINISHED/FAILED, 5% failures
   with five error types). Rounds alternate between the two; the median is printed.
2. End to end: a real agent (`[agent] red_metrics = true` / `false`) and a producer
   process sending the same events over the Unix socket. Printed: events/s until the
   producer's last frame was acked (spooled), and the agent's CPU time per event over
   that span (from /proc), which other processes on the machine disturb less than wall
   time. /metrics is read once, at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aggregator.decode.ndjson import decode_ndjson  # noqa: E402
from aggregator.decode.normalize import Stamp  # noqa: E402
from aggregator.red.metrics import RedMetrics  # noqa: E402
from emitters.ids import new_event_id  # noqa: E402
from sinks.schema import batch_to_bytes  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402

NAMES = [f"{prefix}.{i}" for prefix in ("forward", "backward", "load", "allreduce", "save")
         for i in range(10)]
ERRORS = ("ValueError", "RuntimeError", "OOM", "Timeout", "KeyError")


def make_event(i: int, rng: random.Random, t0: int) -> dict[str, Any]:
    failed = rng.random() < 0.05
    started = not failed and i % 3 == 0
    event: dict[str, Any] = {
        "event_id": new_event_id(t0 + i * 1000), "time": t0 + i * 1000,
        "kind": "op" if i % 4 else "task", "source": "torch", "name": NAMES[i % len(NAMES)],
        "state": "FAILED" if failed else "STARTED" if started else "FINISHED",
        "task_id": os.urandom(8).hex(), "job_id": "job-0042", "run_id": "run-7f3a",
        "host": "gpu-host-017", "trace_id": os.urandom(16).hex(),
        "span_id": os.urandom(8).hex(), "step": i // 50,
        "metrics": {"loss": round(2.5 - i * 1e-5, 6), "lr": 0.0003},
    }
    if not started:
        event["duration_s"] = round(rng.lognormvariate(-3, 2), 6)
    if failed:
        event["error_type"] = rng.choice(ERRORS)
        event["error_message"] = "synthetic failure"
    return event


def make_frames(frames: int, per_frame: int) -> list[bytes]:
    rng = random.Random(11)
    t0 = time.time_ns()
    out = []
    for f in range(frames):
        events = [make_event(f * per_frame + j, rng, t0) for j in range(per_frame)]
        out.append(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    return out


def per_event_us(work: Callable[[bytes], object], frames: list[bytes], events: int) -> float:
    """CPU time of this thread: other processes on a busy machine do not count in it."""
    started = time.thread_time()
    for frame in frames:
        work(frame)
    return (time.thread_time() - started) / events * 1e6


def decode_path(rounds: int) -> None:
    stamp = Stamp(time.time_ns(), 1000, 1000, "node", "host")
    red = RedMetrics()

    def plain(frame: bytes) -> object:
        return batch_to_bytes(decode_ndjson(frame, stamp).batch)

    def derived(frame: bytes) -> object:
        batch = decode_ndjson(frame, stamp).batch
        payload = batch_to_bytes(batch)
        if red.add_batch(batch):  # in the agent the flush runs in an ingest worker thread
            red.flush()
        return payload

    print("decode path, one thread, CPU microseconds per event (median of rounds)")
    print(f"{'frame':>7} {'plain':>8} {'+RED':>8} {'overhead':>9} {'RED alone':>10}")
    for per_frame, count in ((1000, 40), (100, 200)):
        frames = make_frames(count, per_frame)
        events = per_frame * count
        batches = [decode_ndjson(f, stamp).batch for f in frames]
        plain(frames[0])
        derived(frames[0])
        a: list[float] = []
        b: list[float] = []
        alone: list[float] = []
        for _ in range(rounds):
            a.append(per_event_us(plain, frames, events))
            b.append(per_event_us(derived, frames, events))
            started = time.thread_time()
            for batch in batches:
                if red.add_batch(batch):
                    red.flush()
            alone.append((time.thread_time() - started) / events * 1e6)
        pa, pb = statistics.median(a), statistics.median(b)
        print(f"{per_frame:>7} {pa:>8.3f} {pb:>8.3f} {100 * (pb - pa) / pa:>8.1f}% "
              f"{statistics.median(alone):>10.3f}")


PRODUCER = r"""
import sys, time
import emitters
sys.path.insert(0, sys.argv[3])
from bench.bench_red_metrics import make_frames
import orjson
frames = make_frames(int(sys.argv[2]) // 1000, 1000)
emitter = emitters.Emitter(socket=sys.argv[1], max_pending=50_000)
for frame in frames:
    for line in frame.splitlines():
        e = orjson.loads(line)
        emitter.emit(**e)
    emitter.flush(60)
print("ok" if emitter.flush(120) else "lost", flush=True)
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def e2e_once(red: bool, events: int) -> tuple[float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-red-"))
    agent = AgentProcess(workdir, agent_toml=f"red_metrics = {'true' if red else 'false'}")
    agent.start()
    try:
        assert agent.proc is not None
        cpu0 = cpu_seconds(agent.proc.pid)
        started = time.perf_counter()
        producer = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, str(agent.socket_path), str(events), str(REPO)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE)
        # The producer exits once its last frame is acked, i.e. spooled. Reading /metrics
        # meanwhile would add the cost of rendering it many times a second.
        out, _ = producer.communicate(timeout=300)
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(agent.proc.pid) - cpu0
        received = agent.metric('evagg_received_events_total{route="socket"}')
        if producer.returncode or out.strip() != b"ok" or received < events:
            raise RuntimeError(f"the producer failed: {out!r}, {received} events received")
        return events / elapsed, cpu / events * 1e6
    finally:
        agent.stop()


def end_to_end(rounds: int, events: int) -> None:
    print(f"\nend to end through a real agent, {events} events per run "
          "(median of rounds; wall rate is bound by the producer)")
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(rounds):
        for red in (False, True):
            results[red].append(e2e_once(red, events))
    print(f"{'RED':>6} {'events/s':>10} {'agent CPU us/event':>19}")
    for red in (False, True):
        rate = statistics.median(r for r, _ in results[red])
        cpu = statistics.median(c for _, c in results[red])
        print(f"{'on' if red else 'off':>6} {rate:>10.0f} {cpu:>19.2f}")
    off = statistics.median(c for _, c in results[False])
    on = statistics.median(c for _, c in results[True])
    print(f"agent CPU overhead of RED metrics: {100 * (on - off) / off:.1f}%")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--e2e-events", type=int, default=200_000)
    parser.add_argument("--e2e-rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    decode_path(args.rounds)
    if args.e2e_events:
        end_to_end(args.e2e_rounds, args.e2e_events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
