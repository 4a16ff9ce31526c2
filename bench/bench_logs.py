"""Ray log shipping: the agent's CPU and memory while Ray's workers print 1, 10 and 50 MB/s
in total, beside its event path in the same run.

For each rate a fresh agent (Parquet sink in a temp dir, `[ray] log_dir` a temp Ray
root) follows 8 worker files that Ray-shaped events name; writer threads append lines to
them at the rate for `--seconds`, while another thread POSTs 200-event NDJSON bodies to
`/v1/events` every 50 ms and times each answer (the ack: spooled). Printed per rate: what
was written and shipped (and how long shipping took to catch up after the writers
stopped), the agent's CPU seconds over the window as a share of one core, MB shipped per
agent CPU second after the event path's own share (the 0 MB/s row) is taken off (CPU
counted until the last byte is shipped), the
agent's peak RSS, and the event answers' p50/p99. Target: 10 MB/s costs at most a
quarter of one core, and the event answers stay as they are at 0 MB/s.

    .venv/bin/python bench/bench_logs.py [--seconds 10] [--rates 0,1,10,50]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.agentproc import AgentProcess  # noqa: E402
from tests.aggregator.raylogs.rayevents import SESSION, post, running_event, task_hex  # noqa: E402

FILES = 8
MB = 1_000_000


def process_cpu(pid: int) -> Callable[[], float]:
    stat = Path(f"/proc/{pid}/stat")

    def seconds() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    return seconds


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def write_logs(paths: list[Path], rate: float, seconds: float, stop: threading.Event) -> int:
    """Append lines to the files at `rate` bytes/s in total, in 10 ms ticks; bytes written."""
    if rate <= 0:
        stop.wait(seconds)
        return 0
    handles = [path.open("ab") for path in paths]
    text = training_lines()
    written, start, tick = 0, time.monotonic(), 0
    try:
        while not stop.is_set() and time.monotonic() - start < seconds:
            tick += 1
            due = int(rate * min(tick * 0.01, seconds)) - written
            if due > 0:
                at = written % (len(text) - due - 1) if due < len(text) // 2 else 0
                block = text[at:at + due] if due < len(text) // 2 else text * (due // len(text) + 1)
                for i, handle in enumerate(handles):
                    part = block[: due // len(handles)] if i < len(handles) - 1 else \
                        block[: due - (due // len(handles)) * (len(handles) - 1)]
                    handle.write(part)
                    handle.flush()
                    written += len(part)
            pause = start + tick * 0.01 - time.monotonic()
            if pause > 0:
                stop.wait(pause)
    finally:
        for handle in handles:
            handle.close()
    return written


def training_lines() -> bytes:
    """4 MB of lines as a training loop prints them: numbers that change every line (a
    repeated line would compress far better than real output does)."""
    rng = random.Random(7)
    lines = [f"step {i} loss={rng.random():.6f} grad_norm={rng.uniform(0, 5):.4f} "
             f"lr={rng.choice(['3e-4', '1e-4'])} tokens/s={rng.randint(90_000, 130_000)} "
             f"rank={rng.randint(0, 63)} {rng.getrandbits(64):016x}\n" for i in range(40_000)]
    return "".join(lines).encode()


def post_events(url: str, stop: threading.Event, latencies: list[float]) -> None:
    body = b"\n".join(orjson.dumps({"kind": "task", "name": "bench", "state": "FINISHED",
                                    "task_id": f"t{i}", "duration_s": 0.1})
                      for i in range(200))
    while not stop.is_set():
        started = time.perf_counter()
        request = urllib.request.Request(f"{url}/v1/events", data=body,
                                         headers={"Content-Type": "application/x-ndjson"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
        latencies.append(time.perf_counter() - started)
        stop.wait(0.05)


def one_rate(rate_mb: float, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="evagg-bench-logs-") as workdir:
        root = Path(workdir) / "ray"
        logs = root / SESSION / "logs"
        logs.mkdir(parents=True)
        paths = [logs / f"worker-{n:056x}-01000000-{7000 + n}.out" for n in range(FILES)]
        for path in paths:
            path.write_bytes(b"")
        agent_dir = Path(workdir) / "agent"
        agent_dir.mkdir()
        agent = AgentProcess(agent_dir, extra_toml=f'[ray]\nlog_dir = "{root}"\n').start()
        assert agent.proc is not None
        try:
            post(agent.http_url, [running_event(task_hex(n), str(p), str(p.with_suffix(".err")))
                                  for n, p in enumerate(paths)])
            time.sleep(3)  # the follower has seen the names; the first ship is done
            cpu = process_cpu(agent.proc.pid)
            stop, latencies = threading.Event(), list[float]()
            poster = threading.Thread(target=post_events, args=(agent.http_url, stop, latencies))
            cpu_before, started = cpu(), time.monotonic()
            poster.start()
            written = write_logs(paths, rate_mb * MB, seconds, threading.Event())
            window = time.monotonic() - started
            stop.set()
            poster.join()
            writers_done = time.monotonic()
            while agent.metric("evagg_ray_log_bytes_total") < written:
                time.sleep(0.1)
            lag = time.monotonic() - writers_done
            cpu_used = cpu() - cpu_before  # up to the last byte shipped
            shipped = agent.metric("evagg_ray_log_bytes_total")
            rss = peak_rss_mb(agent.proc.pid)
        finally:
            agent.stop()
    latencies.sort()
    return {"rate": rate_mb, "written": written / MB, "shipped": shipped / MB, "lag": lag,
            "cpu": cpu_used, "core": cpu_used / (window + lag), "rss": rss,
            "p50": statistics.median(latencies) * 1e3,
            "p99": latencies[int(len(latencies) * 0.99) - 1] * 1e3, "window": window}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", default="0,1,10,50", help="MB/s, comma-separated")
    args = parser.parse_args()
    rows = [one_rate(float(rate), args.seconds) for rate in args.rates.split(",")]
    base = next((r["core"] for r in rows if r["rate"] == 0), 0.0)
    print(f"{'MB/s':>5} {'written':>8} {'shipped':>8} {'catch-up':>8} {'agent CPU':>10} "
          f"{'of a core':>9} {'logs MB/CPU s':>13} {'peak RSS':>9} {'acks p50':>9} "
          f"{'p99':>7}")
    for r in rows:
        logs_cpu = (r["core"] - base) * (r["window"] + r["lag"])
        per_cpu = f"{r['shipped'] / logs_cpu:.0f}" if r["rate"] and logs_cpu > 0 else "-"
        print(f"{r['rate']:>5g} {r['written']:>6.1f}MB {r['shipped']:>6.1f}MB "
              f"{r['lag']:>7.1f}s {r['cpu']:>9.2f}s {r['core']:>9.2f} {per_cpu:>13} "
              f"{r['rss']:>7.0f}MB {r['p50']:>7.1f}ms {r['p99']:>5.1f}ms")


if __name__ == "__main__":
    main()
