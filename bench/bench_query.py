"""Query layer benchmark: `evagg query summary` and the dashboard's overview request.

    python bench/bench_query.py [--events 1000000] [--small-files 3072] [--keep DIR]
                                [--reuse DIR] [--no-scratch]

Generates one day of events (24 hourly partitions x 8 nodes) with numpy/pyarrow into a
temporary directory: Ray-like task events (3 per attempt, shuffled within the hour, 5%
failed), training ops with steps and a loss metric, OTel-like spans, agent heartbeats,
and 0.5% duplicated events. It times the summary (the same code `evagg query summary`
runs) and GET /api/overview, first over 192 files, then over a small-files layout
(--small-files files) before and after compaction (`evagg compact`'s run_compact when
present, else DuckDB COPY per partition). Targets: summary < 0.5 s, overview < 1 s.

Each layout is measured twice side by side: "scratch" runs tasks.sql over every event
(the Store with fold=False), "fold" uses the incremental task fold with a cache file
(dashboard/lake/fold.py): its first open builds the cache; then the whole `evagg query summary`
command is timed in new processes, and once more after a new file arrived (the fold
reads that file and recomputes the summary). --reuse DIR measures a store generated
before with --keep DIR (its day/ and small/ folders) instead of generating one.

Task fragments, side by side in the same run: the first open of the day (a new fold
cache: listing, fold, the first summary, in process and as a whole `evagg query summary`
command) over its raw files, against a copy of it that `run_compact` merged as the
agent's hour merge leaves a lake (one compacted file and one task fragment under
`_tasks/` per node-hour), and that copy with its fragments removed (the fold reads the
compacted files). The answers must be identical: the summary rows, `count(*)` and
`sum(duration_s)` of `tasks`, and its counts per (name, final_state). Target: the first
open with fragments at most 2 s for 10M events. --fragments-only measures this alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.memory import keep_pandas_out
from dashboard.lake import views
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions import queries
from sinks.parquet.layout import FRAGMENT_SUFFIX, TASKS_ROOT
from sinks.schema import EVENT_SCHEMA

LATE_PARTITION = "date=2025-03-02/hour=00/node=node-0"
DAY0 = np.datetime64("2025-03-01T00:00:00", "ns").astype(np.int64)
NODES = 8
HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
NAMES = np.array([f"fn_{i:02d}" for i in range(40)], dtype=object)
WORKERS = np.array([f"w{i}" for i in range(64)], dtype=object)
ERRORS = np.array(["ValueError", "TimeoutError", "OutOfMemoryError", "KeyError"], dtype=object)


def hex_ids(rng: np.random.Generator, n: int, nbytes: int) -> pa.Array:
    """n random lower-case hex strings of 2*nbytes characters, built without Python loops."""
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    text = np.empty((n, nbytes * 2), dtype=np.uint8)
    text[:, 0::2] = HEX[raw >> 4]
    text[:, 1::2] = HEX[raw & 15]
    offsets = np.arange(0, (n + 1) * nbytes * 2, nbytes * 2, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text.tobytes()))


def pick(values: np.ndarray, index: np.ndarray) -> pa.Array:
    return pa.array(values, pa.string()).take(pa.array(index))


def hour_table(rng: np.random.Generator, hour: int, n: int, run_step0: int) -> pa.Table:
    t0 = int(DAY0) + hour * 3_600_000_000_000
    n_task = (n * 80 // 100) // 3 * 3
    n_op = n * 14 // 100 // 3 * 3
    beats = min(360, n // 20 // NODES)  # one heartbeat per node every 10 s
    n_span = n - n_task - n_op - NODES * beats
    parts = [task_part(rng, t0, n_task), op_part(rng, t0, n_op, run_step0),
             span_part(rng, t0, n_span), agent_part(rng, t0, beats)]
    return pa.concat_tables(parts, promote_options="default")


def base(n: int, kind: str, source: str, times: np.ndarray,
         rng: np.random.Generator) -> dict[str, Any]:
    return {"event_id": hex_ids(rng, n, 16), "kind": pa.array(np.full(n, kind, dtype=object)),
            "source": pa.array(np.full(n, source, dtype=object)),
            "time": pa.array(times, pa.timestamp("ns", tz="UTC")),
            "received": pa.array(times + 5_000_000, pa.timestamp("ns", tz="UTC"))}


def task_part(rng: np.random.Generator, t0: int, n: int) -> pa.Table:
    tasks = n // 3
    ids = hex_ids(rng, tasks, 24)
    start = t0 + rng.integers(0, 3_500_000_000_000, tasks)
    run_s = rng.lognormal(0.0, 1.2, tasks)
    failed = rng.random(tasks) < 0.05
    which = np.tile(np.arange(3), tasks)
    task = np.repeat(np.arange(tasks), 3)
    end_ns = start + 50_000_000 + (run_s * 1e9).astype(np.int64)
    times = np.where(which == 0, start[task],
                     np.where(which == 1, start[task] + 50_000_000, end_ns[task]))
    state = np.where(which == 0, "PENDING", np.where(which == 1, "RUNNING",
                     np.where(failed[task], "FAILED", "FINISHED"))).astype(object)
    terminal = which == 2
    node = task % NODES
    cols = base(n, "task", "ray", times, rng)
    cols.update({
        "state": pa.array(state), "task_id": ids.take(pa.array(task)),
        "attempt": pa.array(np.zeros(n, np.int32)),
        "name": pa.array(NAMES[task % len(NAMES)], mask=which != 0),
        "job_id": pick(np.array([f"job-{i}" for i in range(6)], dtype=object), task % 6),
        "node_id": pick(np.array([f"node-{i}" for i in range(NODES)], dtype=object), node),
        "worker_id": pa.array(WORKERS[task % 64], mask=which != 1),
        "pid": pa.array(np.where(which == 1, 1000 + task % 64, 0).astype(np.int32),
                        mask=which != 1),
        "duration_s": pa.array(run_s[task], mask=~terminal),
        "error_type": pa.array(ERRORS[task % 4], mask=~(terminal & failed[task])),
    })
    table = pa.table(cols)
    return table.take(pa.array(rng.permutation(n)))  # out of order within the hour


def op_part(rng: np.random.Generator, t0: int, n: int, step0: int) -> pa.Table:
    per_step = 3
    step = step0 + np.arange(n) // per_step
    which = np.arange(n) % per_step
    times = t0 + np.arange(n) * (3_600_000_000_000 // max(n, 1))
    is_fwd = which == 0
    loss = np.exp(-step / 50_000.0) + rng.normal(0, 0.01, n)
    offsets = np.concatenate([[0], np.cumsum(is_fwd)]).astype(np.int32)
    metrics = pa.MapArray.from_arrays(pa.array(offsets),
                                      pa.array(np.full(int(is_fwd.sum()), "loss")),
                                      pa.array(loss[is_fwd]))
    cols = base(n, "op", "torch", times, rng)
    cols.update({
        "state": pa.array(np.full(n, "FINISHED", dtype=object)),
        "name": pick(np.array(["forward", "backward", "optimizer.step"], dtype=object), which),
        "run_id": pa.array(np.full(n, "run-1", dtype=object)), "step": pa.array(step),
        "span_id": hex_ids(rng, n, 8), "node_id": pa.array(np.full(n, "node-0", dtype=object)),
        "duration_s": pa.array(rng.uniform(0.01, 0.3, n)), "metrics": metrics,
    })
    return pa.table(cols)


def span_part(rng: np.random.Generator, t0: int, n: int) -> pa.Table:
    traces = max(1, n // 10)
    trace = np.arange(n) // 10 % traces
    trace_ids = hex_ids(rng, traces, 16)
    span_ids = hex_ids(rng, n, 8)
    first = (np.arange(n) // 10) * 10
    start = t0 + rng.integers(0, 3_500_000_000_000, traces)
    cols = base(n, "span", "otel", start[trace] + (np.arange(n) % 10) * 1_000_000, rng)
    cols.update({
        "state": pa.array(np.full(n, "FINISHED", dtype=object)),
        "name": pick(np.array(["request", "db.query", "render"], dtype=object),
                     np.minimum(np.arange(n) % 10, 2)),
        "trace_id": trace_ids.take(pa.array(trace)), "span_id": span_ids,
        "parent_span_id": span_ids.take(pa.array(first)).to_numpy(zero_copy_only=False),
        "node_id": pick(np.array([f"node-{i}" for i in range(NODES)], dtype=object), trace % NODES),
        "duration_s": pa.array(rng.uniform(0.001, 0.05, n)),
    })
    root = np.arange(n) % 10 == 0
    cols["parent_span_id"] = pa.array(np.where(root, None, cols["parent_span_id"]))
    return pa.table(cols)


def agent_part(rng: np.random.Generator, t0: int, beats: int) -> pa.Table:
    n = NODES * beats
    node = np.arange(n) % NODES
    beat = np.arange(n) // NODES
    times = t0 + beat * 10_000_000_000
    received = (t0 // 10**9 % 100_000 + beat) * 1000.0
    keys = ['evagg_received_events_total{route="socket"}',
            'evagg_delivered_events_total{sink="lake"}']
    metrics = pa.MapArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)),
                                      pa.array(np.tile(keys, n)), pa.array(np.repeat(received, 2)))
    cols = base(n, "agent", "evagg", times, rng)
    cols.update({"state": pa.array(np.full(n, "RUNNING", dtype=object)),
                 "name": pa.array(np.full(n, "heartbeat", dtype=object)),
                 "node_id": pick(np.array([f"node-{i}" for i in range(NODES)], dtype=object), node),
                 "metrics": metrics})
    return pa.table(cols)


def conform(table: pa.Table) -> pa.Table:
    columns = [table[f.name].cast(f.type) if f.name in table.column_names
               else pa.nulls(table.num_rows, f.type) for f in EVENT_SCHEMA]
    return pa.Table.from_arrays(columns, schema=EVENT_SCHEMA)


def generate(root: Path, total: int, files_per_partition: int, seed: int = 7) -> int:
    rng = np.random.default_rng(seed)
    written = 0
    per_hour = total // 24
    for hour in range(24):
        table = conform(hour_table(rng, hour, per_hour, hour * per_hour // 7))
        dup = table.take(pa.array(rng.choice(table.num_rows, table.num_rows // 200, replace=False)))
        node_col = table["node_id"].to_numpy(zero_copy_only=False)
        dup_nodes = dup["node_id"].to_numpy(zero_copy_only=False)
        for n in range(NODES):
            name = f"node-{n}"
            part = table.filter(pa.array(node_col == name))
            folder = root / f"date=2025-03-01/hour={hour:02d}/node={name}"
            folder.mkdir(parents=True, exist_ok=True)
            step = -(-part.num_rows // files_per_partition)
            for i in range(files_per_partition):
                pq.write_table(part.slice(i * step, step), folder / f"part-{i:05d}.parquet",
                               compression="zstd", row_group_size=100_000)
            again = dup.filter(pa.array(dup_nodes == name))
            pq.write_table(again, folder / "part-dup.parquet", compression="zstd")
            written += part.num_rows + again.num_rows
    return written


def best(func: Callable[[], Any], runs: int = 2) -> tuple[float, float]:
    """(first call, median of the `runs` calls after it) in seconds."""
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return times[0], statistics.median(times[1:])


def timed(func: Callable[[], Any]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def summary_over_raw_fold(store: Store) -> float | None:
    """The summary with tasks.sql reading events_raw instead of events (a proposal:
    every aggregate in it ignores duplicates, so it can skip the dedupe)."""
    texts = dict(views.view_files())
    tasks_sql = texts.get("tasks.sql", "")
    if "FROM events\n" not in tasks_sql:
        return None
    store.execute(tasks_sql.replace("VIEW tasks AS", "VIEW tasks_over_raw AS")
                  .replace("FROM events\n", "FROM events_raw\n"), user_sql=True)
    summary = texts["summaries.sql"].split("CREATE OR REPLACE VIEW task_summary AS")[1]
    summary = summary.strip().rstrip(";").replace("FROM tasks", "FROM tasks_over_raw")
    return best(lambda: store.execute(summary), 1)[1]


def overview_request(store: Store) -> tuple[float, float]:
    """(a request that computes, a repeated request served from the cache)."""
    from aiohttp.test_utils import TestClient, TestServer

    from dashboard.web.app import create_app

    async def timed() -> tuple[float, float]:
        async with TestClient(TestServer(create_app(store))) as client:
            out = []
            for _ in range(2):
                started = time.perf_counter()
                response = await client.get("/api/overview")
                assert response.status == 200, await response.text()
                await response.read()
                out.append(time.perf_counter() - started)
            return out[0], out[1]

    return asyncio.run(timed())


def measure(root: Path, label: str) -> dict[str, Any]:
    store = Store(StoreOptions(str(root), refresh_s=3600, fold=False))
    started = time.perf_counter()
    store.refresh()
    open_s = time.perf_counter() - started
    first, warm = best(lambda: queries.summary(store))
    over_raw = summary_over_raw_fold(store)
    count = timed(lambda: store.execute("SELECT count(*) FROM events_raw"))
    fold = timed(lambda: store.execute("SELECT final_state, count(*) FROM tasks GROUP BY 1"))
    dedupe = timed(lambda: store.execute("SELECT kind, count(*) FROM events GROUP BY 1"))
    files = store.describe()["files"]
    computed, cached = overview_request(store)  # the app closes the store when it stops
    return {"layout": f"{label}, scratch", "files": files, "open+list": open_s,
            "summary first": first, "summary warm": warm,
            "summary, tasks on raw": over_raw or float("nan"),
            "overview computed": computed, "overview cached": cached, "count(*) raw": count,
            "tasks by state": fold, "events by kind": dedupe}


def cli_summary(root: Path, cache: Path, runs: int = 3) -> list[float]:
    """Wall seconds of whole `evagg query summary` commands (start, imports, answer)."""
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(root),
                        "--cache", str(cache), "summary"], check=True, capture_output=True,
                       cwd=Path(__file__).resolve().parents[1])
        out.append(time.perf_counter() - started)
    return out


def measure_fold(root: Path, label: str, cache: Path) -> dict[str, Any]:
    store = Store(StoreOptions(str(root), refresh_s=0.0, cache_dir=str(cache)))
    open_s = timed(lambda: store.refresh(views=False))  # builds the cache when it is new
    first, warm = best(lambda: queries.summary(store))
    folded = store.fold.describe() if store.fold else {}
    files = store.describe()["files"]
    computed, cached = overview_request(store)
    commands = cli_summary(root, cache)
    # A file arrives (left in place: deleting it would make the next open rebuild).
    extra = root / LATE_PARTITION / f"part-late-{time.time_ns()}.parquet"
    extra.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(time.time_ns())
    pq.write_table(conform(hour_table(rng, 0, 50_000, 0)), extra, compression="zstd")
    after_new = cli_summary(root, cache, 1)[0]
    late = root / LATE_PARTITION
    extra2 = late / f"part-late-{time.time_ns()}.parquet"
    pq.write_table(conform(hour_table(rng, 1, 50_000, 0)), extra2, compression="zstd")
    with_app = Store(StoreOptions(str(root), refresh_s=0.0, cache_dir=str(cache)))
    overview_new = overview_request(with_app)[0]
    return {"layout": f"{label}, fold", "files": files, "open+list": open_s,
            "summary first": first, "summary warm": warm,
            "summary, tasks on raw": float("nan"), "overview computed": computed,
            "overview cached": cached, "count(*) raw": float("nan"),
            "tasks by state": float("nan"), "events by kind": float("nan"),
            "cli summary (min)": min(commands), "cli summary (max)": max(commands),
            "cli after a new file": after_new, "overview after a new file": overview_new,
            "fold": f"{folded.get('folded_files', 0)}r/{folded.get('adopted_files', 0)}a"}


def compact(root: Path) -> str:
    try:
        from sinks.parquet.compact import run_compact

        run_compact(str(root), grace_s=0.0)
        return "evagg compact (sinks.parquet.compact.run_compact)"
    except ImportError:
        pass
    import duckdb

    con = duckdb.connect()
    for folder in sorted({p.parent for p in root.rglob("*.parquet")}):
        files = sorted(folder.glob("*.parquet"))
        out = folder / "compacted.parquet.tmp"
        listed = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
        con.execute(f"COPY (SELECT * FROM read_parquet([{listed}]) QUALIFY row_number() OVER "
                    f"(PARTITION BY event_id) = 1) TO '{out}' (FORMAT parquet, COMPRESSION zstd, "
                    "ROW_GROUP_SIZE 100000)")
        for f in files:
            f.unlink()
        out.rename(folder / "compacted.parquet")
    return "DuckDB COPY per partition (evagg compact not found)"


FRAGMENT_ANSWERS = {
    "tasks: count, sum(duration_s)": "SELECT count(*), sum(duration_s) FROM tasks",
    "tasks by (name, final_state)":
        "SELECT name, final_state, count(*) FROM tasks GROUP BY ALL ORDER BY ALL",
}


def rounded(rows: list[Any]) -> list[Any]:
    """Rows with floats to 9 significant digits (sums over other orders of rows)."""
    return [[float(f"{v:.9g}") if isinstance(v, float) else v for v in row] for row in rows]


def cli_first_open(root: Path, cache: Path) -> tuple[float, float, float]:
    """One whole `evagg query summary` command on a new cache, the first open: when the
    first byte of its answer arrived, when it exited, its CPU seconds."""
    shutil.rmtree(cache, ignore_errors=True)
    before = os.times()
    started = time.perf_counter()
    command = subprocess.Popen([sys.executable, "-m", "aggregator", "query", "--data",
                                str(root), "--cache", str(cache), "summary"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               cwd=Path(__file__).resolve().parents[1])
    assert command.stdout is not None
    command.stdout.read(1)
    answered = time.perf_counter() - started
    command.stdout.read()
    if command.wait():
        raise SystemExit(f"evagg query summary failed over {root}")
    after = os.times()
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return answered, time.perf_counter() - started, cpu


def wait_for_copy(cache: Path) -> float:
    """Wait until the copy the first command left to a process of its own (dashboard/lake/
    fold_copy.py) is done; returns how long that took (0: none ran, as before it)."""
    try:
        from dashboard.lake import fold_handover
    except ImportError:  # a tree that copies at close
        return 0.0
    started = time.perf_counter()

    def pending(path: Path) -> bool:  # running, or started and not ended by a copy yet
        said = fold_handover.state(path).split(" ")[0]
        return (fold_handover.copying(path) or (said == "yielded" and Path(f"{path}.wal").exists())
                or (said == "" and time.perf_counter() - started < 5))

    for path in cache.glob("*.duckdb"):
        while pending(path):
            if time.perf_counter() - started > 600:
                raise SystemExit(f"the copy into {path} did not end")
            time.sleep(0.05)
    return time.perf_counter() - started


def cpu_of(func: Callable[[], float]) -> tuple[float, float]:
    """func's result and the CPU seconds of the commands it ran (children waited for)."""
    before = os.times()
    found = func()
    after = os.times()
    return found, (after.children_user - before.children_user
                   + after.children_system - before.children_system)


def cli_tasks(root: Path, cache: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(root),
                    "--cache", str(cache), "tasks", "--limit", "20"], check=True,
                   capture_output=True, cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - started


def first_open(root: Path, label: str, cache: Path) -> dict[str, Any]:
    """The fold's first open of `root` (a new cache): listing and fold, then the summary."""
    shutil.rmtree(cache, ignore_errors=True)
    cpu = time.process_time()
    store = Store(StoreOptions(str(root), refresh_s=3600, cache_dir=str(cache)))
    open_s = timed(lambda: store.refresh(views=False))
    summary: list[Any] = []
    summary_s = timed(lambda: summary.extend(queries.summary(store).rows))
    cpu = time.process_time() - cpu  # every thread of this process: DuckDB's too
    answers = {"summary": rounded(summary)}
    answers.update({name: rounded(store.execute(sql, views=False).rows)
                    for name, sql in FRAGMENT_ANSWERS.items()})
    fold = store.fold.describe() if store.fold else {}
    files = store.describe()["files"]
    # a local lake's fragments read in place are copied into the cache here, after the
    # answer (dashboard/lake/fold_place.py)
    close_cpu = time.process_time()
    close_s = timed(store.close)
    close_cpu = time.process_time() - close_cpu
    answered, command, command_cpu = cli_first_open(root, cache)
    # a command started at once (it takes the cache from the copy, if one runs), then the
    # later commands once the copy is done; CPU of the commands alone (an orphaned copy
    # is not a child of this process)
    right_after, right_after_cpu = cpu_of(lambda: cli_summary(root, cache, 1)[0])
    copy_s = wait_for_copy(cache)
    later, later_cpu = cpu_of(lambda: min(cli_summary(root, cache, 2)))
    tasks, tasks_cpu = cpu_of(lambda: min(cli_tasks(root, cache) for _ in range(2)))
    return {"layout": label, "files": files, "first open: list+fold": open_s,
            "first open: summary": summary_s, "first open: total": open_s + summary_s,
            "first open: CPU": cpu, "first open: close (copy)": close_s,
            "first open: close CPU": close_cpu,
            "first command: answer": answered, "first open: whole command": command,
            "first command: CPU": command_cpu,
            "a command right after": right_after, "  its CPU": right_after_cpu,
            "then the copy ended after": copy_s,
            "later command (min)": later, "  CPU of two": later_cpu,
            "later tasks --limit 20 (min)": tasks, "  CPU of two ": tasks_cpu,
            "fold": "/".join(str(fold.get(k, "-")) for k in
                             ("folded_files", "adopted_files", "fragment_files")),
            "answers": answers}


def fragments_side_by_side(day: Path, merged: Path, cache: Path,
                           merged_only: bool = False) -> list[dict[str, Any]]:
    """The day over its raw files against a merged copy with fragments and without."""
    rows = [] if merged_only else [first_open(day, "raw files (today)", cache / "raw")]
    if not (merged / TASKS_ROOT).is_dir():
        shutil.rmtree(merged, ignore_errors=True)
        shutil.copytree(day, merged)
        started = time.perf_counter()
        report = compact_with_fragments(merged)
        print(f"hour merges over the day's copy: {report} in "
              f"{time.perf_counter() - started:.1f} s")
    rows.append(first_open(merged, "merged + fragments", cache / "fragments"))
    if merged_only:
        return rows
    hidden = merged.parent / f"{merged.name}-tasks-aside"
    (merged / TASKS_ROOT).rename(hidden)
    try:
        rows.append(first_open(merged, "merged, no fragments", cache / "merged"))
    finally:
        hidden.rename(merged / TASKS_ROOT)
    return rows


def compact_with_fragments(root: Path) -> str:
    from sinks.parquet.compact import run_compact

    report = run_compact(str(root), grace_s=0.0)
    fragments = sum(1 for _ in (root / TASKS_ROOT).rglob(f"*{FRAGMENT_SUFFIX}"))
    if report.errors:
        raise SystemExit(f"the merges failed: {report.errors[0]}")
    return (f"{report.merged_files} files into {report.written_files} compacted files and "
            f"{fragments} task fragments")


def print_fragments(rows: list[dict[str, Any]]) -> None:
    print("first open, task fragments side by side (fold: read/adopted/from fragments):")
    print_rows([{k: v for k, v in r.items() if k != "answers"} for r in rows])
    if len(rows) < 3:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        return
    raw, fragments, merged = (r["first open: total"] for r in rows)
    command = [r["first open: whole command"] for r in rows]
    print(f"raw / fragments: {raw / fragments:.1f}x in process, "
          f"{command[0] / command[1]:.1f}x as a command; merged without fragments / with: "
          f"{merged / fragments:.1f}x, {command[2] / command[1]:.1f}x")
    for name in rows[0]["answers"]:
        same = all(r["answers"][name] == rows[0]["answers"][name] for r in rows[1:])
        print(f"answers identical, {name}: {same}")
        if not same:
            for r in rows:
                print(f"  {r['layout']}: {r['answers'][name][:4]}")
    print(f"target: first open with fragments at most 2 s: {fragments:.2f} s in process, "
          f"{command[1]:.2f} s as a command (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs)")


def print_rows(rows: list[dict[str, Any]]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    width = max(len(k) for k in keys)
    for key in keys:
        cells = [f"{r[key]:.3f} s" if isinstance(r.get(key), float) else str(r.get(key, ""))
                 for r in rows]
        print(f"{key:<{width}}  " + "  ".join(f"{c:>22}" for c in cells))


def main() -> int:
    keep_pandas_out()  # as `evagg query` and `evagg dashboard` do (aggregator/memory.py)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events to generate (the issue's figure: 10000000)")
    parser.add_argument("--small-files", type=int, default=3072,
                        help="files in the small-files layout (spread over 192 partitions)")
    parser.add_argument("--keep", type=Path, help="write here and keep it (default: a temp dir)")
    parser.add_argument("--reuse", type=Path, help="measure a store kept with --keep DIR")
    parser.add_argument("--no-scratch", action="store_true",
                        help="skip the slow from-scratch (fold=False) measurements")
    parser.add_argument("--fragments-only", action="store_true",
                        help="only the first open with task fragments against without")
    parser.add_argument("--merged-only", action="store_true",
                        help="with --fragments-only: only the merged lake with its fragments")
    args = parser.parse_args()
    base_dir = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="evagg-bench-query-"))
    cache = Path(tempfile.mkdtemp(prefix="evagg-bench-cache-"))
    try:
        big, small = base_dir / "day", base_dir / "small"
        per_partition = max(1, args.small_files // (24 * NODES))
        if args.reuse is None:
            started = time.perf_counter()
            events = generate(big, args.events, 1)
            print(f"generated {events:,} rows (0.5% duplicates) in "
                  f"{time.perf_counter() - started:.1f} s")
            if not args.fragments_only:
                generate(small, args.events, per_partition)
        fragment_rows = fragments_side_by_side(big, base_dir / "day-merged", cache / "first",
                                               args.merged_only and args.fragments_only)
        if args.fragments_only:
            print_fragments(fragment_rows)
            return 0
        rows = []
        for root, label in ((big, "24 h x 8 nodes"), (small, "small files")):
            if not args.no_scratch:
                rows.append(measure(root, label))
            rows.append(measure_fold(root, label, cache / root.name))
        how = compact(small)
        if not args.no_scratch:
            rows.append(measure(small, "after compaction"))
        rows.append(measure_fold(small, "after compaction", cache / small.name))
        print(f"compaction: {how}")
        print_rows(rows)
        print_fragments(fragment_rows)
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        fold = next(r for r in rows if r["layout"].startswith("24 h") and "fold" in r["layout"])
        summary, overview = fold["summary warm"], fold["overview computed"]
        print(f"targets (fold): summary < 0.5 s: {summary:.3f} s in process, "
              f"{fold['cli summary (min)']:.3f}-{fold['cli summary (max)']:.3f} s as a command, "
              f"{fold['cli after a new file']:.3f} s after a new file; "
              f"overview < 1 s: {overview:.3f} s computed, {fold['overview cached']:.3f} s cached")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        for root in (base_dir / "day", base_dir / "small"):
            shutil.rmtree(root / LATE_PARTITION.split("/")[0], ignore_errors=True)
        if args.keep is None and args.reuse is None:
            shutil.rmtree(base_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
