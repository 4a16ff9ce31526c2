"""Ray's State API from the store: `ray list tasks --limit 10000` and `tasks/summarize`
against `evagg dashboard` over 1M Ray task attempts, beside the same calls against a
live Ray head holding 10,000 tasks, in one run.

    python bench/bench_ray_state.py [--tasks 1000000] [--live-tasks 10000] [--no-live]
                                    [--repeat 5] [--keep DIR]

Generates the store with tests/dashboard/raygen.py (five rows per attempt, as the agent
stores Ray 2.60's export, out of order), starts `evagg dashboard --no-cache` on it, and
asks once to build the task fold (printed apart: a dashboard pays it once per start, or
once ever with its cache). Then, per call: the HTTP answer time of the request Ray's
client sends (each with another `timeout` value, so no answer comes from the
dashboard's per-version cache), and the wall time of the real `ray` command (mostly
Ray's own start-up: its imports take seconds). The live head runs `--live-tasks`
trivial tasks in a local `ray.init()` cluster, waits until its State API lists them
all, and is asked the same. Target: under 1 s per answer from evagg.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dashboard.raygen import write_ray_lake  # noqa: E402
from tests.ports import free_port  # noqa: E402

BIN = Path(sys.executable).parent
LIST = "/api/v0/tasks?limit=10000&detail=False&exclude_driver=True&timeout={t}"
SUMMARY = "/api/v0/tasks/summarize?timeout={t}&summary_by=func_name"


def get(url: str) -> tuple[float, Any]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as answer:
        body = json.loads(answer.read())
    return time.perf_counter() - start, body


def times(call: Callable[[int], float], repeat: int) -> str:
    seen = [call(i) for i in range(repeat)]
    return f"p50 {statistics.median(seen):7.3f} s  max {max(seen):7.3f} s  (n={repeat})"


def ray_cli_s(address: str, *args: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    start = time.perf_counter()
    done = subprocess.run([str(BIN / "ray"), *args, "--address", address], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ray {' '.join(args)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def measure(label: str, base: str, repeat: int, *, t0: int) -> None:
    def http(path: str) -> Callable[[int], float]:
        return lambda i: get(base + path.format(t=t0 + i))[0]

    _, listed = get(base + LIST.format(t=t0 - 1))
    page = listed["data"]["result"]
    print(f"{label}: {page['total']:,} tasks, list answers {len(page['result']):,}")
    print(f"  GET tasks?limit=10000        {times(http(LIST), repeat)}")
    print(f"  GET tasks/summarize          {times(http(SUMMARY), repeat)}")
    print(f"  ray list tasks --limit 10000 "
          f"{times(lambda i: ray_cli_s(base, 'list', 'tasks', '--limit', '10000'), 2)}")
    summary = times(lambda i: ray_cli_s(base, "summary", "tasks"), 2)
    print(f"  ray summary tasks            {summary}")


def evagg_side(lake: Path, tasks: int, repeat: int) -> None:
    start = time.perf_counter()
    write_ray_lake(lake, tasks)
    size = sum(p.stat().st_size for p in lake.rglob("*.parquet"))
    print(f"generated {tasks:,} attempts ({tasks * 5:,} rows, {size / 2**20:.0f} MiB) in "
          f"{time.perf_counter() - start:.1f} s")
    port = free_port()
    server = subprocess.Popen([str(BIN / "evagg"), "dashboard", "--data", str(lake), "--no-cache",
                               "--listen", f"127.0.0.1:{port}", "--refresh", "3600",
                               "--query-timeout", "600"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        _wait(lambda: get(base + "/api/ray/sessions"), 600)  # lists and folds the store
        print(f"dashboard up, every task event folded, sessions read: "
              f"{time.perf_counter() - started:.1f} s (once per start without a cache)")
        measure("evagg dashboard", base, repeat, t0=100)
    finally:
        server.terminate()
        server.wait(30)


def live_side(tasks: int, repeat: int) -> None:
    import ray
    from ray.util.state import summarize_tasks

    from tests.raylocal import local_ray

    with local_ray({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}):
        @ray.remote
        def tick(i: int) -> int:
            return i

        start = time.perf_counter()
        for first in range(0, tasks, 1000):
            ray.get([tick.remote(i) for i in range(first, min(tasks, first + 1000))])
        print(f"live Ray head: ran {tasks:,} tasks in {time.perf_counter() - start:.1f} s")

        def settled() -> bool:
            found = summarize_tasks(raise_on_missing_output=False)["cluster"]
            return bool(found["total_tasks"] >= tasks)

        _wait(settled, 120)
        webui = ray._private.worker.global_worker.node.address_info["webui_url"]
        measure("live Ray head", f"http://{webui}", repeat, t0=100)


def _wait(check: Callable[[], Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {timeout} s")
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--live-tasks", type=int, default=10_000)
    parser.add_argument("--no-live", action="store_true", help="skip the live Ray head")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", metavar="DIR", help="write the store here and keep it")
    args = parser.parse_args()
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-ray-state-"))
    try:
        evagg_side(scratch / "lake", args.tasks, args.repeat)
        if not args.no_live:
            live_side(args.live_tasks, args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
