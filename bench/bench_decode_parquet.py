"""Decode and Parquet costs per event, peers side by side.

    .venv/bin/python bench/bench_decode_parquet.py [--frames 40] [--seconds 1.5]

Events look like our emitter's: about 400 bytes of JSON, 16 fields, three hex ids
(task, trace, span) besides the UUIDv7 event id, and a metrics map; frames of 1000 events.
Decoders: `decode_ndjson` (pyarrow.json bulk path; wall time with 1 and 2 threads, and the
CPU time of the decoding thread, which other load on a shared machine does not inflate),
DuckDB `read_ndjson` (explicit columns, from a temporary file), and the careful path
(orjson, one dict per event).
Parquet: `ParquetSink` into a `LocalStore`, zstd, row groups of 100k and 10k rows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import orjson

from aggregator.decode.ndjson import decode_careful, decode_ndjson, fallback_counts
from aggregator.decode.normalize import Stamp, ndjson_to_batch
from emitters.ids import new_event_id
from sinks.parquet import ParquetSink
from sinks.parquet.options import ParquetOptions
from sinks.parquet.stores import LocalStore
from sinks.records import SpoolRecord
from sinks.schema import batch_to_bytes

EVENTS_PER_FRAME = 1000
OPS = ("forward", "backward", "optimizer.step", "allreduce", "dataloader.next")
DUCKDB_COLUMNS = {
    "event_id": "VARCHAR",
    "time": "BIGINT",
    "kind": "VARCHAR",
    "source": "VARCHAR",
    "name": "VARCHAR",
    "state": "VARCHAR",
    "task_id": "VARCHAR",
    "attempt": "INTEGER",
    "job_id": "VARCHAR",
    "run_id": "VARCHAR",
    "host": "VARCHAR",
    "trace_id": "VARCHAR",
    "span_id": "VARCHAR",
    "step": "BIGINT",
    "duration_s": "DOUBLE",
    "metrics": "MAP(VARCHAR, DOUBLE)",
    "attrs": "MAP(VARCHAR, VARCHAR)",
    "nonfinite": "VARCHAR[]",
}


def make_event(i: int, t0: int, rng: random.Random, trace_id: str) -> dict[str, Any]:
    return {
        "event_id": new_event_id(t0 + i * 1_000_000),
        "time": t0 + i * 1_000_000,
        "kind": "op",
        "source": "torch",
        "name": OPS[i % len(OPS)],
        "state": "FINISHED",
        "task_id": os.urandom(8).hex(),
        "attempt": 0,
        "job_id": "job-0042",
        "run_id": "run-7f3a",
        "host": "gpu-host-017",
        "trace_id": trace_id,
        "span_id": os.urandom(8).hex(),
        "step": i // len(OPS),
        "duration_s": round(rng.expovariate(20), 6),
        "metrics": {
            "loss": round(2.5 - i * 1e-5 + rng.random() * 0.01, 6),
            "lr": 0.0003,
            "tokens": 4096,
        },
    }


def make_frames(count: int) -> list[bytes]:
    rng = random.Random(7)
    t0 = time.time_ns()
    frames = []
    for f in range(count):
        events = []
        for j in range(EVENTS_PER_FRAME):
            i = f * EVENTS_PER_FRAME + j
            if i % len(OPS) == 0:
                trace_id = os.urandom(16).hex()  # one trace per training step
            events.append(make_event(i, t0, rng, trace_id))
        frames.append(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    return frames


def per_event(
    fn: Callable[[bytes], object], frames: list[bytes], seconds: float, threads: int = 1
) -> float:
    """Microseconds per event while `threads` threads run `fn` over the frames."""
    fn(frames[0])
    done = [0] * threads

    def loop(slot: int) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for frame in frames:
                fn(frame)
                done[slot] += EVENTS_PER_FRAME

    start = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.perf_counter() - start) / sum(done) * 1e6


def cpu_per_event(fn: Callable[[bytes], object], frames: list[bytes], seconds: float) -> float:
    """Microseconds of this thread's CPU per event: other load on the machine does not count."""
    fn(frames[0])
    events = 0
    end = time.perf_counter() + seconds
    start = time.thread_time()
    while time.perf_counter() < end:
        for frame in frames:
            fn(frame)
            events += EVENTS_PER_FRAME
    return (time.thread_time() - start) / events * 1e6


def report(label: str, micros: float) -> None:
    print(f"  {label:44s} {micros:7.3f} µs/event {1e6 / micros:12,.0f} events/s")


def bench_decode(frames: list[bytes], seconds: float, scratch: Path) -> None:
    stamp = Stamp.now("node-a", "gpu-host-017", 1234, 1000)
    size = sum(map(len, frames)) / len(frames) / EVENTS_PER_FRAME
    print(f"decode, frames of {EVENTS_PER_FRAME} events, {size:.0f} bytes/event")
    report(
        "decode_ndjson (pyarrow.json bulk)",
        per_event(lambda f: decode_ndjson(f, stamp), frames, seconds),
    )
    report(
        "decode_ndjson, 2 threads", per_event(lambda f: decode_ndjson(f, stamp), frames, seconds, 2)
    )
    connection = duckdb.connect()
    connection.execute("SET threads = 1")
    path = scratch / "frame.ndjson"

    def duck(frame: bytes) -> object:
        path.write_bytes(frame)
        return connection.read_json(
            str(path), format="newline_delimited", columns=DUCKDB_COLUMNS
        ).arrow()

    report("DuckDB read_ndjson (columns given, no fix-up)", per_event(duck, frames, seconds))
    report(
        "careful path (orjson + from_pydict)",
        per_event(lambda f: ndjson_to_batch(f, stamp), frames, seconds / 2),
    )
    report(
        "decode_careful (+ sorted maps)",
        per_event(lambda f: decode_careful(f, stamp), frames, seconds / 2),
    )
    report(
        "decode_ndjson, CPU time of its thread",
        cpu_per_event(lambda f: decode_ndjson(f, stamp), frames, seconds),
    )
    print(f"  fallbacks seen: {fallback_counts() or 'none'}")
    print("  (DuckDB with given columns drops unknown fields and turns 5 into '5' silently;")
    print("   with auto-detection it costs several times more per frame)")


def spool_records(frames: list[bytes]) -> list[SpoolRecord]:
    """Distinct events throughout, so that repeats cannot flatter the compression."""
    stamp = Stamp.now("node-a", "gpu-host-017", 1234, 1000)
    return [
        SpoolRecord(
            n + 1,
            bytes(16),
            n + 1,
            stamp.received_ns,
            EVENTS_PER_FRAME,
            batch_to_bytes(decode_ndjson(frame, stamp).batch),
        )
        for n, frame in enumerate(frames)
    ]


def bench_parquet(frames: list[bytes], scratch: Path) -> None:
    records = spool_records(frames)
    print(f"Parquet via ParquetSink, zstd, {len(records) * EVENTS_PER_FRAME:,} events")
    for row_group_rows in (100_000, 10_000):
        root = scratch / f"rg{row_group_rows}"
        sink = ParquetSink(
            "bench",
            LocalStore(root),
            ParquetOptions(roll_max_bytes=1 << 40, row_group_rows=row_group_rows),
            node_id="node-a",
            spool_id="bench",
        )

        async def write_all(sink: ParquetSink = sink) -> None:
            for start in range(0, len(records), 10):
                await sink.write(records[start : start + 10])
            result = await sink.flush(final=True)
            assert result.ok, result.error

        start = time.perf_counter()
        asyncio.run(write_all())
        elapsed = time.perf_counter() - start
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        events = len(records) * EVENTS_PER_FRAME
        report(f"row groups of {row_group_rows:,} rows", elapsed / events * 1e6)
        print(f"  {'':44s} {size / events:7.1f} bytes/event on disk (target <= 65)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=40, help="distinct frames of 1000 events")
    parser.add_argument("--seconds", type=float, default=1.5, help="time per decode measurement")
    parser.add_argument("--parquet-events", type=int, default=200_000)
    args = parser.parse_args()
    frames = make_frames(max(args.frames, args.parquet_events // EVENTS_PER_FRAME))
    with tempfile.TemporaryDirectory(prefix="evagg-bench-") as scratch:
        bench_decode(frames[: args.frames], args.seconds, Path(scratch))
        bench_parquet(frames[: args.parquet_events // EVENTS_PER_FRAME], Path(scratch))


if __name__ == "__main__":
    main()
