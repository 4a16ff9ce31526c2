"""What a node-hour's task fragment costs the agent that merges the hour.

    python bench/bench_fragments.py [--events 1000000] [--files 720] [--runs 3]
                                    [--us-per-event 5.7,7.2,11.5,15.5]

One hour of a busy node: --events events (the mix of bench/bench_query.py: 80% Ray-like
task events, training ops, spans, heartbeats, 0.5% duplicated) written in receive order
as --files small files with the sink's writer (sinks/parquet/writer.py; 720 is the local
sink's 5 s roll, 60 the S3 sink's minute). On copies of that hour, side by side and
alternating, it times the hour merge as the agent's HourCompaction runs it (run_compact
on the node-hour partition) with the task fragment and without it (the fragment's write
and mending patched out), and `write_fragment` alone on the merged file. Figures are CPU
seconds of this process (every thread: DuckDB's, pyarrow's) and wall seconds.

The agent's CPU for that hour of events is --events times its ingest CPU per event
(docs/performance.md, socket -> spool -> Parquet: 5.7-7.2 us per event for COLUMNS
frames, 11.5-15.5 for NDJSON); the fragment's share of it is the figure to hold to
at most 5%. Loading DuckDB into the agent (once per process, on the first merge) is
measured apart, in a fresh interpreter that has pyarrow loaded as the agent has.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_query import conform, hour_table

import sinks.parquet.compact as compact_module
from sinks.fragments.build import Spill, write_fragment
from sinks.parquet.compact import run_compact
from sinks.parquet.compact_targets import spill_room
from sinks.parquet.layout import TASKS_ROOT, fragment_key, is_compacted_name
from sinks.parquet.writer import open_writer

PARTITION = "date=2025-03-01/hour=00/node=node-0"
DEFAULT_US_PER_EVENT = "5.7,7.2,11.5,15.5"


def node_hour(events: int, seed: int) -> pa.Table:
    """One node's hour of events, in receive order, as the sink's spool hands them over."""
    rng = np.random.default_rng(seed)
    table = conform(hour_table(rng, 0, events - events // 200, 0))
    dup = table.take(pa.array(rng.choice(table.num_rows, events // 200, replace=False)))
    table = pa.concat_tables([table, dup])
    table = table.set_column(table.schema.get_field_index("node_id"), "node_id",
                             pa.array(np.full(table.num_rows, "node-0", dtype=object),
                                      pa.string()))
    return table.take(pc.sort_indices(table, [("received", "ascending")]))


def write_hour(table: pa.Table, folder: Path, files: int) -> int:
    """The hour as the sink leaves it: `files` files named as the sink names them."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-table.num_rows // files)
    written = 0
    for i in range(files):
        part = table.slice(i * step, step)
        if part.num_rows == 0:
            break
        path = folder / f"part-bench-{i * step:020d}.parquet"
        with open_writer(path, part.schema) as writer:
            writer.write_table(part, row_group_size=10_000)
        written += path.stat().st_size
    return written


@contextlib.contextmanager
def without_fragments() -> Iterator[None]:
    """The hour merge as it was before fragments: no fragment written, none mended."""
    publish, mend = compact_module._publish_fragment, compact_module._mend_fragments

    def no_publish(*_: Any, **__: Any) -> None:
        return None

    def no_mend(*_: Any, **__: Any) -> int:
        return 0

    compact_module._publish_fragment = no_publish
    compact_module._mend_fragments = no_mend
    try:
        yield
    finally:
        compact_module._publish_fragment = publish
        compact_module._mend_fragments = mend


def cpu_and_wall(func: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = func()
    return time.process_time() - cpu, time.perf_counter() - wall, out


def merge_once(source: Path, scratch: Path, fragments: bool) -> tuple[float, float, Path]:
    """run_compact over a fresh copy of the hour; (CPU s, wall s, the copy's root)."""
    root = scratch / f"lake-{time.time_ns()}"
    shutil.copytree(source, root / PARTITION)

    def merge() -> Any:
        return run_compact(str(root), partition=PARTITION, grace_s=0.0)

    if fragments:
        cpu, wall, report = cpu_and_wall(merge)
    else:
        with without_fragments():
            cpu, wall, report = cpu_and_wall(merge)
    if report.errors or report.written_files != 1:
        raise SystemExit(f"the merge did not write one file: {report}")
    return cpu, wall, root


def duckdb_load_cost() -> tuple[float, float]:
    """(CPU s, RSS MiB) that `import duckdb` plus a first connection add to a process that
    has pyarrow loaded (the agent loads DuckDB on its first hour merge)."""
    code = ("import time; import pyarrow, pyarrow.parquet\n"
            "def rss():\n"
            "    with open('/proc/self/statm') as f:\n"
            "        return int(f.read().split()[1]) * 4096 / 2**20\n"
            "r0 = rss(); t = time.process_time()\n"
            "import duckdb; duckdb.connect(config={'threads': 1}).execute('SELECT 1')\n"
            "print(time.process_time() - t, rss() - r0)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1])


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events in the node-hour (default 1000000)")
    parser.add_argument("--files", type=int, default=720,
                        help="files the sink wrote in that hour (720: a 5 s roll; S3's is 60)")
    parser.add_argument("--runs", type=int, default=3, help="merges of each kind (alternating)")
    parser.add_argument("--us-per-event", default=DEFAULT_US_PER_EVENT,
                        help="the agent's ingest CPU per event, us, comma-separated "
                             "(docs/performance.md)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="evagg-bench-fragments-"))
    try:
        started = time.perf_counter()
        table = node_hour(args.events, seed=11)
        source = scratch / "hour"
        event_bytes = write_hour(table, source, args.files)
        tasks = int(pc.sum(pc.equal(table["kind"], "task")).as_py())
        print(f"one node-hour: {table.num_rows:,} events ({tasks:,} task events) in "
              f"{args.files} files, {event_bytes / 2**20:.1f} MiB, generated in "
              f"{time.perf_counter() - started:.1f} s")
        import duckdb  # loaded before timing, as in an agent past its first merge

        duckdb.connect().close()
        with_cpu: list[float] = []
        with_wall: list[float] = []
        without_cpu: list[float] = []
        without_wall: list[float] = []
        merged: Path | None = None
        fragment_bytes = compacted_bytes = 0
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(args.runs):
            cpu, wall, root = merge_once(source, scratch, fragments=False)
            without_cpu.append(cpu)
            without_wall.append(wall)
            if merged is None:
                merged = root
            else:
                shutil.rmtree(root)
            cpu, wall, root = merge_once(source, scratch, fragments=True)
            with_cpu.append(cpu)
            with_wall.append(wall)
            fragment_bytes = sum(p.stat().st_size for p in (root / TASKS_ROOT).rglob("*.pq"))
            compacted_bytes = sum(p.stat().st_size for p in (root / PARTITION).iterdir())
            shutil.rmtree(root)
        assert merged is not None
        compacted = next(p for p in (merged / PARTITION).iterdir()
                         if is_compacted_name(p.name))
        frag_cpu: list[float] = []
        frag_wall: list[float] = []
        rows = 0
        for i in range(args.runs):
            out = scratch / f"fragment-{i}.pq"

            def fragment(out: Path = out) -> int:
                return write_fragment(compacted, out, compacted.name,
                                      Spill(scratch, spill_room(scratch)))

            cpu, wall, rows = cpu_and_wall(fragment)
            frag_cpu.append(cpu)
            frag_wall.append(wall)
        rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        load_cpu, load_rss = duckdb_load_cost()

        print(f"merged file {compacted_bytes / 2**20:.1f} MiB; fragment "
              f"{fragment_bytes / 2**20:.2f} MiB ({rows:,} task attempts; "
              f"{fragment_bytes / max(event_bytes, 1):.1%} of the event bytes), key "
              f"{fragment_key(PARTITION, compacted.name)}")
        print(f"CPU seconds per node-hour ({args.runs} runs each, median):")
        print(f"  hour merge without fragment  {spread(without_cpu)}; wall {spread(without_wall)}")
        print(f"  hour merge with fragment     {spread(with_cpu)}; wall {spread(with_wall)}")
        delta = median(with_cpu) - median(without_cpu)
        print(f"  difference                   {delta:.3f} s "
              f"({delta / median(without_cpu):+.0%} on the merge)")
        print(f"  write_fragment alone         {spread(frag_cpu)}; wall {spread(frag_wall)}")
        per_event_us = median(frag_cpu) / table.num_rows * 1e6
        print(f"  write_fragment per event     {per_event_us:.3f} us "
              f"({median(frag_cpu) / max(tasks, 1) * 1e6:.3f} us per task event)")
        print(f"  loading DuckDB (once per agent process): {load_cpu:.3f} CPU s, "
              f"+{load_rss:.0f} MiB RSS; peak RSS grew {rss_growth:.0f} MiB during the merges")
        print(f"share of the agent's CPU for this hour of events ({table.num_rows:,} events):")
        print(f"  {'ingest us/event':>15}  {'agent CPU s':>11}  {'write_fragment':>14}  "
              f"{'merge with - without':>20}  {'merge+fragment':>14}  {'merge, no fragment':>18}")
        worst = 0.0
        for figure in (float(v) for v in args.us_per_event.split(",")):
            agent = table.num_rows * figure / 1e6
            share = median(frag_cpu) / agent
            worst = max(worst, share)
            print(f"  {figure:>15.1f}  {agent:>11.2f}  {share:>14.2%}  {delta / agent:>20.2%}  "
                  f"{median(with_cpu) / agent:>14.1%}  {median(without_cpu) / agent:>18.1%}")
        print(f"target: the fragment at most 5% of the agent's CPU: {worst:.2%} at the "
              f"cheapest ingest figure ({'met' if worst <= 0.05 else 'NOT met'})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
