"""What the hour merge adds to the agent's resident memory, by the size of the hour.

    python bench/bench_merge_memory.py [--events 1000000,2500000] [--files 720] [--runs 1]

The agent merges each hour it has moved past inside its own process (`compact = true`),
so the merge's peak is what an operator must leave room for under the agent's memory
limit (the DaemonSet's is 1 GiB). For each --events, one node-hour (bench_fragments.py's
mix, 0.5% duplicated ids) is written as --files small files; then each merge runs in a
fresh interpreter set up as the agent sets itself up (Arrow's jemalloc pool, one malloc
arena, no pandas, DuckDB already loaded), and its peak resident memory above what the
process held before it (VmHWM reset through /proc/self/clear_refs) is printed, with the
fragment and without it, beside its CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTITION = "date=2025-03-01/hour=00/node=node-0"
AGENT_LIMIT_MIB = 1024  # deploy/evagg-daemonset.yaml: the DaemonSet's memory limit
AGENT_BUSY_MIB = 150  # docs/operations.md: the agent's RSS at full load, before a merge


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(lake: str, fragments: bool) -> None:
    """One merge in this fresh process; prints a JSON line of its figures."""
    from aggregator.memory import keep_pandas_out, prefer_returning_pool

    prefer_returning_pool()
    keep_pandas_out()
    import duckdb  # loaded before the baseline: its load is bench_fragments.py's figure
    duckdb.connect().close()

    import bench_fragments

    from sinks.parquet.compact import run_compact

    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    cpu = time.process_time()

    def merge() -> object:
        return run_compact(lake, partition=PARTITION, grace_s=0.0)

    if fragments:
        report = merge()
    else:
        with bench_fragments.without_fragments():
            report = merge()
    cpu = time.process_time() - cpu
    print(json.dumps({"rss_before_mib": before / 1024, "peak_added_mib":
                      (_status_kib("VmHWM") - before) / 1024, "cpu_s": cpu,
                      "report": str(report)[:200]}))


def measure(source: Path, scratch: Path, fragments: bool) -> dict[str, float]:
    import shutil

    root = scratch / f"lake-{time.time_ns()}"
    shutil.copytree(source, root / PARTITION)
    try:
        out = subprocess.run([sys.executable, __file__, "--child", str(root),
                              "--fragments" if fragments else "--no-fragments"],
                             check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(root)
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", default="1000000,2500000",
                        help="events per node-hour, comma-separated")
    parser.add_argument("--files", type=int, default=720, help="files the hour arrives in")
    parser.add_argument("--runs", type=int, default=1, help="merges of each kind")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--fragments", action=argparse.BooleanOptionalAction, default=True,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.fragments)
        return 0
    import bench_fragments

    print(f"{'events':>10} {'fragment':>8} {'RSS before':>10} {'peak added':>10} "
          f"{'per event':>9} {'CPU s':>6}")
    with tempfile.TemporaryDirectory(prefix="bench-merge-memory-") as tmp:
        for events in (int(e) for e in args.events.split(",")):
            source = Path(tmp) / f"hour-{events}"
            bench_fragments.write_hour(bench_fragments.node_hour(events, seed=7),
                                       source, args.files)
            for _ in range(args.runs):
                for fragments in (False, True):
                    got = measure(source, Path(tmp), fragments)
                    print(f"{events:>10,} {'yes' if fragments else 'no':>8} "
                          f"{got['rss_before_mib']:>7.0f} MiB {got['peak_added_mib']:>6.0f} MiB "
                          f"{got['peak_added_mib'] * 2**20 / events:>7.0f} B "
                          f"{got['cpu_s']:>6.2f}", flush=True)
    print(f"\nUnder a {AGENT_LIMIT_MIB} MiB limit, with the agent at about {AGENT_BUSY_MIB} "
          "MiB before it merges, an hour fits while its peak added stays under "
          f"{AGENT_LIMIT_MIB - AGENT_BUSY_MIB} MiB.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
