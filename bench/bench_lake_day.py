"""A simulated lake day on S3: N nodes' minute files, their hour merges and fragments, and
the dashboard over it.

    python bench/bench_lake_day.py [--nodes 1000] [--hours 1] [--events-per-file 50]
                                   [--merge-workers 2] [--raw-open]

An S3 server (moto, on 127.0.0.1 only, in a child process) holds the lake. Every node
writes one file a minute (the S3 sink's roll) for --hours hours: --events-per-file events
each in the mix of bench/bench_query.py (80% Ray-like task events), written with the
sink's writer under the sink's keys (`date=/hour=/node=/part-<spool>-<offset>.parquet`).
Then each node-hour is merged as the agent's HourCompaction merges it (run_compact on
that `date=/hour=/node=` partition: the merged file, its task fragment under `_tasks/`,
the inputs deleted), --merge-workers at a time. It reports the objects each hour wrote
and deleted, fragment bytes against event bytes, the CPU of one merge, and the
dashboard's Store over the s3:// lake (its task fold with a cache file): the first open
(listing, folding, the summary), the same after one more minute of files (a new file per
node), and, side by side, a first open with the fragments removed (the fold reads the
compacted event files), answers compared. --raw-open also times a first open before the
merges (the fold of every minute file: the state of the current hour).

Only what runs is measured; the per-hour and per-day figures for the full fleet printed
at the end are extrapolated from it, linearly in nodes and hours, and say so.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_query import conform, hour_table

from aggregator.memory import keep_pandas_out
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions import queries
from sinks.parquet.layout import TASKS_ROOT, object_key
from sinks.parquet.writer import open_writer

BUCKET = "evagg-lake-day"
PREFIX = "lake/"
FILES_PER_HOUR = 60  # the S3 sink rolls a file a minute
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
MOTO = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""
ANSWERS = {
    "tasks: count, sum(duration_s)":
        "SELECT count(*), round(sum(duration_s), 6) FROM tasks",
    "tasks by name, final_state":
        "SELECT name, final_state, count(*) FROM tasks GROUP BY ALL ORDER BY ALL",
}


@dataclass
class Counts:
    event_files: int = 0
    event_bytes: int = 0
    events: int = 0
    compacted: int = 0
    compacted_bytes: int = 0
    fragments: int = 0
    fragment_bytes: int = 0
    deleted: int = 0
    delete_requests: int = 0


def start_moto() -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen([sys.executable, "-c", MOTO], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    port = int(child.stdout.readline())
    return child, f"http://127.0.0.1:{port}"


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(s3={"addressing_style": "path"}, max_pool_connections=16)
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def node_hour_files(rng: np.random.Generator, node: int, hour: int,
                    per_file: int, files: int) -> list[tuple[str, bytes]]:
    """One node's hour as the S3 sink writes it: `files` files in receive order."""
    table = conform(hour_table(rng, hour, per_file * files, hour * per_file * files // 7))
    table = table.set_column(table.schema.get_field_index("node_id"), "node_id",
                             pa.array(np.full(table.num_rows, f"node-{node:04d}", dtype=object),
                                      pa.string()))
    table = table.take(pc.sort_indices(table, [("received", "ascending")]))
    out = []
    step = -(-table.num_rows // files)
    for i in range(files):
        part = table.slice(i * step, step)
        if part.num_rows == 0:
            break
        received = part["received"][0].value
        key = object_key(received, f"node-{node:04d}", "bench", i * step)
        sink = pa.BufferOutputStream()
        with open_writer(sink, part.schema) as writer:
            writer.write_table(part, row_group_size=10_000)
        out.append((key, sink.getvalue().to_pybytes()))
    return out


def minute_file(rng: np.random.Generator, node: int, hour: int, minute: int,
                per_file: int) -> tuple[str, bytes]:
    """One more minute's file of a node (the refresh case)."""
    key, data = node_hour_files(rng, node, hour, per_file, 1)[0]
    return key.replace("part-bench-", f"part-bench{minute:02d}-"), data


def put_all(client: Any, items: list[tuple[str, bytes]], pool: concurrent.futures.Executor
            ) -> None:
    def put(item: tuple[str, bytes]) -> None:
        client.put_object(Bucket=BUCKET, Key=PREFIX + item[0], Body=item[1])

    for _ in pool.map(put, items):
        pass


def write_hours(client: Any, nodes: int, hours: int, per_file: int, counts: Counts) -> float:
    """Every node's minute files of every hour; returns wall seconds spent."""
    started = time.perf_counter()
    rng = np.random.default_rng(5)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for hour in range(hours):
            for node in range(nodes):
                files = node_hour_files(rng, node, hour, per_file, FILES_PER_HOUR)
                counts.event_files += len(files)
                counts.event_bytes += sum(len(data) for _, data in files)
                counts.events += per_file * FILES_PER_HOUR
                put_all(client, files, pool)
                if node % 100 == 99:
                    print(f"  hour {hour:02d}: {node + 1} nodes written, "
                          f"{time.perf_counter() - started:.0f} s so far", flush=True)
            print(f"  hour {hour:02d}: {nodes * FILES_PER_HOUR:,} files put, "
                  f"{time.perf_counter() - started:.0f} s so far", flush=True)
    return time.perf_counter() - started


def merge_partition(location: str, partition: str, endpoint: str) -> dict[str, Any]:
    """One node-hour's merge, as HourCompaction runs it (in a worker process)."""
    from sinks.parquet.compact import run_compact

    cpu, wall = time.process_time(), time.perf_counter()
    report = run_compact(location, partition=partition, grace_s=0.0, endpoint_url=endpoint,
                         now=time.time() + 5)
    part = report.partitions[0] if report.partitions else None
    return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
            "errors": report.errors, "merged": report.merged_files,
            "written": report.written_files, "deleted": report.deleted_files,
            "fragments": 1 if part and part.output else 0}


def worker_init() -> None:
    os.environ.update(AWS_ENV)


def merge_hours(endpoint: str, nodes: int, hours: int, workers: int
                ) -> tuple[float, list[dict[str, Any]]]:
    location = f"s3://{BUCKET}/{PREFIX}"
    partitions = [f"date=2025-03-01/hour={h:02d}/node=node-{n:04d}"
                  for h in range(hours) for n in range(nodes)]
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=worker_init) as pool:
        results = list(pool.map(merge_partition, [location] * len(partitions), partitions,
                                [endpoint] * len(partitions), chunksize=8))
    return time.perf_counter() - started, results


def list_sizes(client: Any, prefix: str) -> list[int]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [int(item["Size"]) for page in pages for item in page.get("Contents", [])]


def delete_prefix(client: Any, prefix: str) -> int:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=BUCKET, Delete={
            "Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})
    return len(keys)


def timed(func: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = func()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def open_store(endpoint: str, cache: Path, label: str) -> tuple[Store, dict[str, Any]]:
    """A first open of the lake by the dashboard's Store (new cache): the listing and the
    fold, then the summary, as `evagg query summary` runs them."""
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    store = Store(StoreOptions(f"s3://{BUCKET}/{PREFIX}", endpoint_url=endpoint,
                               refresh_s=0.0, cache_dir=str(cache)))
    open_s, open_cpu, listing = timed(lambda: store.refresh(views=False))
    summary_s, _, summary = timed(lambda: queries.summary(store))
    fold = store.fold.describe() if store.fold else {}
    row = {"layout": label, "engine": store.engine, "files listed": len(listing.files),
           "open (list + fold)": open_s, "of it CPU (this process)": open_cpu,
           "first summary": summary_s, "first open total": open_s + summary_s,
           "fold": ", ".join(f"{k.removesuffix('_files')}={v}" for k, v in fold.items()
                             if k.endswith("_files")),
           "answers": answers(store, summary.rows)}
    return store, row


def answers(store: Store, summary: list[Any]) -> dict[str, Any]:
    out = {name: store.execute(sql, views=False).rows for name, sql in ANSWERS.items()}
    out["summary"] = summary
    return out


def refresh_after_minute(store: Store, client: Any, nodes: int, hour: int, per_file: int,
                         row: dict[str, Any]) -> None:
    rng = np.random.default_rng(time.time_ns())
    items = [minute_file(rng, n, hour, 0, per_file) for n in range(nodes)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        put_all(client, items, pool)
    refresh_s, refresh_cpu, listing = timed(lambda: store.refresh(views=False))
    summary_s, _, summary = timed(lambda: queries.summary(store))
    row["answers"] = answers(store, summary.rows)  # what the open without fragments sees
    row.update({"after a new minute: refresh": refresh_s,
                "after a new minute: of it CPU": refresh_cpu,
                "after a new minute: summary": summary_s,
                "after a new minute: total": refresh_s + summary_s,
                "after a new minute: files": len(listing.files)})


def print_rows(rows: list[dict[str, Any]]) -> None:
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "answers"]
    width = max(len(k) for k in keys)
    for key in keys:
        cells = [f"{r[key]:.3f} s" if isinstance(r.get(key), float) else str(r.get(key, ""))
                 for r in rows]
        print(f"{key:<{width}}  " + "  ".join(f"{c:>30}" for c in cells))


def main() -> int:
    keep_pandas_out()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=1, help="hours simulated (a day is 24)")
    parser.add_argument("--events-per-file", type=int, default=50,
                        help="events in each node's minute file")
    parser.add_argument("--merge-workers", type=int, default=2,
                        help="node-hour merges run at once (each in a process of its own)")
    parser.add_argument("--raw-open", action="store_true",
                        help="also time a first open before the merges (every minute file)")
    args = parser.parse_args()
    os.environ.update(AWS_ENV)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        os.environ.pop(name, None)
    moto, endpoint = start_moto()
    scratch = Path(tempfile.mkdtemp(prefix="evagg-bench-lake-day-"))
    try:
        client = s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        counts = Counts()
        print(f"{args.nodes} nodes x {args.hours} h x {FILES_PER_HOUR} files of "
              f"{args.events_per_file} events, S3 at {endpoint} (moto)")
        write_s = write_hours(client, args.nodes, args.hours, args.events_per_file, counts)
        print(f"wrote {counts.event_files:,} event files ({counts.events:,} events, "
              f"{counts.event_bytes / 2**20:.1f} MiB) in {write_s:.0f} s "
              f"({counts.event_files / write_s:.0f} PUTs/s)", flush=True)
        rows: list[dict[str, Any]] = []
        if args.raw_open:
            store, row = open_store(endpoint, scratch / "cache-raw", "minute files (no merge)")
            store.close()
            rows.append(row)
        merge_s, results = merge_hours(endpoint, args.nodes, args.hours, args.merge_workers)
        errors = [e for r in results for e in r["errors"]]
        if errors:
            print(f"{len(errors)} merge errors, the first: {errors[0]}")
        counts.compacted = sum(r["written"] for r in results)
        counts.deleted = sum(r["deleted"] for r in results)
        counts.delete_requests = sum(1 for r in results if r["deleted"])
        fragment_sizes = list_sizes(client, PREFIX + TASKS_ROOT + "/")
        counts.fragments, counts.fragment_bytes = len(fragment_sizes), sum(fragment_sizes)
        event_sizes = list_sizes(client, PREFIX + "date=")
        counts.compacted_bytes = sum(event_sizes)
        merge_cpu = [r["cpu"] for r in results]
        merge_wall = [r["wall"] for r in results]
        node_hours = args.nodes * args.hours
        print(f"merged {node_hours:,} node-hours in {merge_s:.0f} s with {args.merge_workers} "
              f"workers; per merge CPU median {statistics.median(merge_cpu):.3f} s "
              f"(p90 {np.percentile(merge_cpu, 90):.3f}), wall median "
              f"{statistics.median(merge_wall):.3f} s", flush=True)

        store, with_fragments = open_store(endpoint, scratch / "cache-merged",
                                           "merged, with fragments")
        refresh_after_minute(store, client, args.nodes, args.hours, args.events_per_file,
                             with_fragments)
        store.close()
        removed = delete_prefix(client, PREFIX + TASKS_ROOT + "/")
        store, without = open_store(endpoint, scratch / "cache-nofrag",
                                    f"merged, {removed} fragments removed")
        store.close()
        rows += [with_fragments, without]
        print_rows(rows)
        same = with_fragments["answers"] == without["answers"]
        print(f"answers identical with and without fragments, after the new minute (summary, "
              f"tasks count and sum(duration_s), per (name, final_state)): {same}")
        if not same:
            for name in with_fragments["answers"]:
                a, b = with_fragments["answers"][name], without["answers"][name]
                if a != b:
                    print(f"  {name} differs: {a[:3]} ... against {b[:3]} ...")
        if with_fragments["first open total"] > 0:
            ratio = without["first open total"] / with_fragments["first open total"]
            print(f"first open without fragments / with: {ratio:.2f}x")
        report(counts, args, merge_cpu, merge_s)
    finally:
        assert moto.stdin is not None
        moto.stdin.close()
        moto.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def report(counts: Counts, args: argparse.Namespace, merge_cpu: list[float],
           merge_s: float) -> None:
    hours, nodes = args.hours, args.nodes
    per_hour = {"event files PUT": counts.event_files / hours,
                "compacted files PUT": counts.compacted / hours,
                "fragments PUT": counts.fragments / hours,
                "objects deleted": counts.deleted / hours,
                "DeleteObjects requests": counts.delete_requests / hours}
    print(f"measured, per hour of {nodes} nodes ({hours} h run):")
    for name, value in per_hour.items():
        print(f"  {name:<24} {value:>12,.0f}")
    print(f"  bytes: event files {counts.event_bytes / hours / 2**20:.1f} MiB, compacted "
          f"{counts.compacted_bytes / hours / 2**20:.1f} MiB, fragments "
          f"{counts.fragment_bytes / hours / 2**20:.1f} MiB "
          f"({counts.fragment_bytes / max(counts.event_bytes, 1):.1%} of the event bytes, "
          f"{counts.fragment_bytes / max(counts.fragments, 1) / 1024:.1f} KiB each)")
    print(f"  hour merges: {sum(merge_cpu) / hours:.0f} CPU s per hour of the fleet "
          f"({statistics.median(merge_cpu):.3f} s per node-hour), {merge_s / hours:.0f} s "
          f"wall here with {args.merge_workers} workers")
    fleet = 1000
    scale = fleet / nodes
    print(f"extrapolated (linear in nodes and hours) to {fleet} nodes, this file size:")
    for name, value in per_hour.items():
        print(f"  {name:<24} {value * scale:>12,.0f} per hour {value * scale * 24:>14,.0f} "
              f"per day")
    mib = counts.fragment_bytes / hours / 2**20 * scale
    live = scale * (counts.compacted + counts.fragments) / hours * 24
    print(f"  fragment bytes           {mib:>12,.1f} MiB per hour {mib * 24:>10,.1f} MiB per day"
          f"; objects live at the end of a day: {live:,.0f} (merged + fragments)")


if __name__ == "__main__":
    sys.exit(main())
