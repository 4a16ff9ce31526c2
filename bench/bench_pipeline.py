"""Producers -> agent -> spool -> Parquet, sustained: events/s, MB/s, agent CPU and RSS.

Senders replay pre-encoded frames of emitter-shaped events (1000 per frame) over the
Unix socket with a window of unacked frames, so the agent, not the producers, is what
is measured: the same events as NDJSON (BATCH) and as COLUMNS frames, side by side in
one run, the agent pinned to one core and the senders to the others (taskset), then
free on all cores with --all-cores. One line per run, with the wire bytes per event.
Usage: python bench/bench_pipeline.py [--seconds 20] [--frames columns,ndjson]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emitters import wire  # noqa: E402
from emitters.columns import encode_rows  # noqa: E402
from emitters.ids import new_event_id, new_span_id, new_trace_id  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402

EVENTS_PER_FRAME = 1000


BASE = {"source": "torch", "job_id": "job-0001", "run_id": "run-bench-42",
        "node_id": "gpu-node-17"}  # the emitter's context: once per COLUMNS frame


def make_payloads(frames: str, count: int = 64) -> list[bytes]:
    """Distinct frames, so Parquet's compression sees realistic, non-repeating ids."""
    return [make_payload(frames) for _ in range(count)]


def make_payload(frames: str = "ndjson") -> bytes:
    events = make_events()
    if frames == "columns":
        return encode_rows([{k: v for k, v in e.items() if k not in BASE} for e in events], BASE)
    return b"\n".join(orjson.dumps(e) for e in events)


def make_events() -> list[dict[str, object]]:
    now = time.time_ns()
    events = [{
        "event_id": new_event_id(now + i), "time": now + i * 1000, "kind": "op",
        "source": "torch", "name": ("forward", "backward", "optimizer.step")[i % 3],
        "state": "FINISHED", "task_id": new_span_id(), "job_id": "job-0001",
        "run_id": "run-bench-42", "node_id": "gpu-node-17", "step": i // 3,
        "duration_s": 0.0123 + i * 1e-6, "trace_id": new_trace_id(), "span_id": new_span_id(),
        "metrics": {"loss": 1.0 / (i + 1), "grad_norm": 0.5 + i % 7},
        "attrs": {"rank": str(i % 8), "model": "llama-7b"},
    } for i in range(EVENTS_PER_FRAME)]
    return events


def sender(path: str, payloads: list[bytes], stop_at: float, window: int,
           out: mp.Queue, frames: str, cores: set[int] | None) -> None:
    if cores:
        os.sched_setaffinity(0, cores)  # off the agent's core
    encode = wire.encode_columns if frames == "columns" else wire.encode_batch
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    session, seq, acked, buffer = os.urandom(16), 0, 0, wire.FrameBuffer()
    while time.monotonic() < stop_at or seq > acked:
        while seq - acked < window and time.monotonic() < stop_at:
            seq += 1
            payload = payloads[seq % len(payloads)]
            sock.sendall(encode(session, seq, EVENTS_PER_FRAME, payload))
        buffer.feed(sock.recv(1 << 16))
        for frame in buffer.frames():
            assert isinstance(frame, wire.Ack), frame
            acked = frame.seq
    sock.close()
    out.put(acked * EVENTS_PER_FRAME)


def _cpu(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    """Samples the agent's RSS and CPU from /proc while it runs."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_rss, self.running = pid, 0, True

    def cpu_seconds(self) -> float:
        return _cpu(Path(f"/proc/{self.pid}/stat"))

    def thread_cpu(self) -> dict[str, float]:
        """CPU seconds by thread role: the event loop (the main thread), decode, the loop's
        pool (the Parquet writes), the hour merge, the rest (threads name themselves:
        emitters/thread_names.py)."""
        out: dict[str, float] = {}
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                seconds = _cpu(task / "stat")
            except OSError:
                continue  # the thread ended meanwhile
            role = ("event loop" if task.name == str(self.pid) else
                    "decode" if name.startswith("evagg-decode") else
                    "parquet and I/O pool" if name.startswith("evagg-worker") else
                    "hour merge" if name.startswith("evagg-hour-com") else
                    "other threads")
            out[role] = out.get(role, 0.0) + seconds
        return out

    def run(self) -> None:
        while self.running:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)
            time.sleep(0.2)


def run(label: str, cores: str | None, seconds: float, senders: int, frames: str,
        env: dict[str, str] | None = None) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="evagg-bench-"))
    agent = AgentProcess(workdir, env=env, spool_toml='max_bytes = "8GiB"',
                         sinks_toml='[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                                    'url = "{lake}"\nroll_max_bytes = "32MiB"\n'
                                    'roll_interval = "2s"\n')
    agent.start()
    assert agent.proc is not None
    if cores:
        subprocess.run(["taskset", "-a", "-p", "-c", cores, str(agent.proc.pid)],
                       check=True, capture_output=True)
    payloads = make_payloads(frames)
    others = set(range(os.cpu_count() or 1)) - {int(c) for c in cores.split(",")} if cores else None
    sampler = Sampler(agent.proc.pid)
    sampler.start()
    cpu_before = sampler.cpu_seconds()
    threads_before = sampler.thread_cpu()
    results: mp.Queue = mp.Queue()
    started = time.monotonic()
    procs = [mp.Process(target=sender, args=(str(agent.socket_path), payloads,
                                             started + seconds, 8, results, frames,
                                             others or None))
             for _ in range(senders)]
    for proc in procs:
        proc.start()
    sent = sum(results.get(timeout=seconds + 120) for _ in procs)
    acked_at = time.monotonic()
    agent.wait_delivered(sent, timeout=600)
    delivered_at = time.monotonic()
    cpu = sampler.cpu_seconds() - cpu_before
    threads = {role: seconds - threads_before.get(role, 0.0)
               for role, seconds in sampler.thread_cpu().items()}
    sampler.running = False
    agent.stop()
    disk = sum(f.stat().st_size for f in agent.lake_dir.rglob("*.parquet"))
    wall = delivered_at - started
    wire_bytes = (sum(map(len, payloads)) / len(payloads) + 34) / EVENTS_PER_FRAME
    print(f"{label:<36} {sent / (acked_at - started):>10,.0f} ev/s acked "
          f"{sent / wall:>10,.0f} ev/s into Parquet "
          f"{wire_bytes:>5.0f} B/event on the wire  "
          f"agent CPU {cpu / wall * 100:>5.0f}%  "
          f"{cpu / sent * 1e6:>5.2f} us/event  peak RSS {sampler.peak_rss / 2**20:>5.0f} MiB  "
          f"{disk / sent:>5.1f} B/event on disk")
    print(f"{'':<36} per event: " + ", ".join(
        f"{role} {seconds / sent * 1e6:.2f} us" for role, seconds in sorted(threads.items())))
    shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--frames", default="columns,ndjson",
                        help="frame types to run, in order: columns, ndjson")
    parser.add_argument("--all-cores", action="store_true",
                        help="also run the agent free on all cores")
    parser.add_argument("--pools", action="store_true",
                        help="also compare Arrow's memory pools (RSS)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; frames of {EVENTS_PER_FRAME} events, "
          f"{len(make_payload()) // EVENTS_PER_FRAME} bytes/event as NDJSON")
    for frames in args.frames.split(","):
        run(f"{frames}: agent on one core (cpu 0)", "0", args.seconds, args.senders, frames)
    for frames in args.frames.split(",") if args.all_cores else ():
        run(f"{frames}: agent on all cores", None, args.seconds, args.senders, frames)
    if args.pools:
        for pool in ("system", "jemalloc", "mimalloc"):
            run(f"all cores, {pool} pool", None, args.seconds, args.senders, "columns",
                env={"ARROW_DEFAULT_MEMORY_POOL": pool})


if __name__ == "__main__":
    main()
