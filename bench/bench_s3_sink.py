"""Parquet sink throughput: spool records -> ParquetSink -> a local directory, and -> S3
(a moto server in another process on loopback), side by side.

Records are Arrow batches of 1,000 events that would be ~400 bytes each as JSON, as the
spool holds them. The sink is driven as the delivery loop drives it (16 records per
write, a final flush), pinned to one CPU; moto runs pinned to another when there is one,
so "sink CPU" is what the agent spends. Wall figures include the uploads: the sink
publishes a file before taking more records, as in the agent.

    .venv/bin/python bench/bench_s3_sink.py [--events 3000000] [--roll-mib 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sinks.parquet import ParquetSink  # noqa: E402
from sinks.parquet.options import ParquetOptions, S3Options  # noqa: E402
from sinks.parquet.s3 import S3Store  # noqa: E402
from sinks.parquet.stores import LocalStore, ObjectStore  # noqa: E402
from sinks.records import SpoolRecord  # noqa: E402
from sinks.schema import EVENT_SCHEMA, batch_to_bytes  # noqa: E402

EVENTS_PER_RECORD = 1000
RECORDS_PER_WRITE = 16
DISTINCT_PAYLOADS = 32


def make_payloads() -> tuple[list[bytes], int]:
    """Distinct record payloads, and the mean JSON size of one of their events."""
    payloads, json_bytes = [], 0
    now = time.time_ns()
    for n in range(DISTINCT_PAYLOADS):
        rows = []
        for i in range(EVENTS_PER_RECORD):
            step = n * EVENTS_PER_RECORD + i
            rows.append({
                "event_id": str(uuid.uuid7()) if hasattr(uuid, "uuid7") else uuid.uuid4().hex,
                "time": now + step * 1000, "kind": "task", "source": "ray",
                "name": f"train_step_{step % 50}", "state": "FINISHED",
                "task_id": os.urandom(12).hex(), "attempt": 0, "job_id": "02000000",
                "run_id": "run-2026-01-02", "node_id": "node-7f3a", "host": "gpu-host-17",
                "pid": 4242 + step % 8, "uid": 1000, "span_id": os.urandom(8).hex(),
                "step": step, "duration_s": 0.25 + (step % 97) / 1000,
                "metrics": {"loss": 1.0 / (step + 1), "lr": 3e-4},
                "attrs": {"queue": "default"}, "received": now + step * 1000,
            })
        json_bytes += len(orjson.dumps(rows, default=str))
        batch = pa.RecordBatch.from_pylist(rows, schema=EVENT_SCHEMA)
        payloads.append(batch_to_bytes(batch))
    return payloads, json_bytes // (DISTINCT_PAYLOADS * EVENTS_PER_RECORD)


async def drive(store: ObjectStore, payloads: list[bytes], events: int,
                roll_bytes: int) -> tuple[float, float, int, float]:
    publish, publishing = store.publish, [0.0]

    async def timed_publish(staged: Path, key: str) -> None:
        started = time.perf_counter()
        await publish(staged, key)
        publishing[0] += time.perf_counter() - started

    store.publish = timed_publish  # type: ignore[method-assign]
    options = ParquetOptions(roll_max_bytes=roll_bytes, roll_interval_s=3600)
    sink = ParquetSink("bench", store, options, node_id="bench-node", spool_id="bench")
    records = events // EVENTS_PER_RECORD
    received = time.time_ns()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for start in range(0, records, RECORDS_PER_WRITE):
        chunk = [SpoolRecord(offset, bytes(16), offset, received, EVENTS_PER_RECORD,
                             payloads[offset % len(payloads)])
                 for offset in range(start + 1, min(start + RECORDS_PER_WRITE, records) + 1)]
        result = await sink.write(chunk)
        assert result.ok, result
    result = await sink.flush(final=True)
    assert result.ok, result
    await sink.close()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall, cpu, records * EVENTS_PER_RECORD, publishing[0] / wall


def start_moto(cpu: int | None) -> tuple[subprocess.Popen[str], str, str]:
    code = ("import sys, os; from tests.sinks.moto_server import MotoS3\n"
            "m = MotoS3().start(); print(m.endpoint_url, m.create_bucket(), flush=True)\n"
            "sys.stdin.read()")
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    assert proc.stdout is not None
    endpoint, bucket = proc.stdout.readline().split()
    return proc, endpoint, bucket


def report(label: str, run: tuple[float, float, int, float], json_bytes: int,
           files: int, stored: int) -> None:
    wall, cpu, events, publishing = run
    mib_s = events * json_bytes / wall / 2**20
    print(f"{label:<24} {events / wall:>10,.0f} events/s  {mib_s:>5,.0f} MiB/s of JSON  "
          f"sink CPU {cpu / events * 1e6:>5.2f} us/event  "
          f"{files:>3} files  {stored / events:>5.1f} bytes/event  "
          f"publishing {publishing:>4.0%} of wall")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--roll-mib", type=int, default=64)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    sink_cpu, moto_cpu = cpus[0], (cpus[1] if len(cpus) > 1 else None)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    payloads, json_bytes = make_payloads()
    print(f"{args.events:,} events of ~{json_bytes} bytes as JSON, records of "
          f"{EVENTS_PER_RECORD}, files up to {args.roll_mib} MiB; sink on CPU {sink_cpu}, "
          f"moto on {moto_cpu if moto_cpu is not None else 'the same CPU'}")
    moto, endpoint, bucket = start_moto(moto_cpu)
    os.sched_setaffinity(0, {sink_cpu})
    roll = args.roll_mib * 2**20
    try:
        with tempfile.TemporaryDirectory(prefix="evagg-bench-") as scratch:
            local = LocalStore(Path(scratch) / "lake")
            run = asyncio.run(drive(local, payloads, args.events, roll))
            files = list((Path(scratch) / "lake").rglob("*.parquet"))
            report("local directory", run, json_bytes, len(files),
                   sum(f.stat().st_size for f in files))
            for label, threshold in (("s3 (moto), multipart", 8 * 2**20),
                                     ("s3 (moto), single PUT", 2**40)):
                s3 = S3Options(endpoint_url=endpoint, region="us-east-1", path_style=True,
                               multipart_threshold=threshold)
                store = S3Store(f"s3://{bucket}/{uuid.uuid4().hex[:6]}/", s3,
                                staging_dir=Path(scratch) / "staging")
                run = asyncio.run(drive(store, payloads, args.events, roll))
                listed = store.client.list_objects_v2(Bucket=bucket, Prefix=store.prefix)
                sizes = [item["Size"] for item in listed.get("Contents", [])]
                report(label, run, json_bytes, len(sizes), sum(sizes))
    finally:
        assert moto.stdin is not None
        moto.stdin.close()
        moto.wait(timeout=30)


if __name__ == "__main__":
    main()
