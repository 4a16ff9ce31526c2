"""A lake split as a cluster splits its task events, for the tests of task fragments.

A Ray attempt's owner events (definition, PENDING, SUBMITTED, FINISHED/FAILED) land on one
node and its executor's RUNNING on another, a third of the stream an hour later; each
node-hour is written as two files and a resent copy of its first row. Mixed in with every
recorded Ray 2.60 event: evagg's own tasks with sub-microsecond times, FAILED with error
types, attempts that never end, an end evagg inferred and a real end after it, a task of
one event, a nameless attempt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.ray.events import ray_events_to_rows
from sinks.parquet.layout import object_key
from sinks.parquet.writer import open_writer, written_schema
from sinks.schema import EVENT_SCHEMA
from tests.agentproc import REPO

HOUR_NS = 3_600_000_000_000
T0 = 1_767_322_800_000_000_000  # 2026-01-02 03:00 UTC
OWNER, EXECUTOR = "node-owner", "node-exec"


def ray_rows() -> list[dict[str, Any]]:
    """Every recorded Ray 2.60 event, mapped as the agent maps them."""
    items: list[Any] = []
    for path in sorted((REPO / "tests" / "fixtures" / "ray").glob("*.json")):
        doc = orjson.loads(path.read_bytes())
        items += doc["events"] if isinstance(doc, dict) else doc
    rows, _ = ray_events_to_rows(items)
    return [dict(r) for r in rows]


def evagg_rows() -> list[dict[str, Any]]:
    """evagg's own task events, with the odd shapes the fold must get right."""
    def at(seconds: float, nanos: int = 0) -> str:
        ns = T0 + int(seconds * 1e9) + nanos
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + \
            f".{ns % 10**9:09d}Z"
    rows: list[dict[str, Any]] = []
    for i in range(40):
        task = {"kind": "task", "task_id": f"t{i:03d}", "name": f"fn_{i % 5}", "job_id": "j1"}
        rows.append({**task, "event_id": f"e{i:03d}-run", "state": "RUNNING",
                     "time": at(i * 60, 123)})
        if i % 4 == 1:
            rows.append({**task, "event_id": f"e{i:03d}-end", "state": "FAILED",
                         "time": at(i * 60 + 30.5, 999), "error_type": "ValueError",
                         "error_message": f"bad input {i}"})
        elif i % 4 != 3:  # every fourth never ends
            rows.append({**task, "event_id": f"e{i:03d}-end", "state": "FINISHED",
                         "time": at(i * 60 + 3000, 7), "duration_s": 1.5 if i % 2 else None})
    rows.append({"kind": "task", "task_id": "inferred", "name": "late", "event_id": "i-run",
                 "state": "RUNNING", "time": at(10)})
    rows.append({"kind": "task", "task_id": "inferred", "event_id": "i-inf", "state": "FAILED",
                 "time": at(20), "error_type": "WORKER_DIED",
                 "attrs": {"evagg_inferred": "its worker died"}})
    rows.append({"kind": "task", "task_id": "inferred", "event_id": "i-real",
                 "state": "FINISHED", "time": at(15)})
    rows.append({"kind": "task", "name": "standalone", "event_id": "solo", "state": "FINISHED",
                 "time": at(5), "duration_s": 2.0})
    rows.append({"kind": "task", "task_id": "t001", "attempt": 1, "event_id": "nameless",
                 "state": "RUNNING", "time": at(100)})
    return [{k: v for k, v in r.items() if v is not None} for r in rows]


def place(row: dict[str, Any], index: int) -> tuple[str, int]:
    """The node and receive time a row lands with: executor events on their own node, and
    the second half of the stream an hour later."""
    node = EXECUTOR if row.get("state") == "RUNNING" else OWNER
    return node, T0 + (HOUR_NS if index % 3 == 0 else 0) + index * 1000


def write_lake(lake: Path, rows: list[dict[str, Any]]) -> None:
    placed: dict[str, list[pa.RecordBatch]] = {}
    for index, row in enumerate(rows):
        node, received = place(row, index)
        batch = rows_to_batch([row], Stamp(received_ns=received, node_id=node)).batch
        key = object_key(received, node, "spoolA", index)
        placed.setdefault(key.rsplit("/", 1)[0], []).append(batch)
    for directory, batches in placed.items():
        table = pa.Table.from_batches(batches, schema=EVENT_SCHEMA)
        halves = [table.slice(0, table.num_rows // 2), table.slice(table.num_rows // 2)]
        for n, half in enumerate([*halves, table.slice(0, 1)]):  # the last: a resent row
            path = lake / directory / f"part-spoolA-{n:020d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open_writer(path, written_schema(EVENT_SCHEMA)) as writer:
                writer.write_table(half.cast(written_schema(EVENT_SCHEMA), safe=False))
            old = time.time() - 7200
            os.utime(path, (old, old))


def split_lake_rows() -> list[dict[str, Any]]:
    return ray_rows() + evagg_rows()


def write_merged_lake(lake: Path) -> Path:
    """The split lake as the agent's hour merges leave it: compacted files and their task
    fragments."""
    from sinks.parquet.compact import run_compact

    write_lake(lake, split_lake_rows())
    report = run_compact(str(lake), grace_s=0.0)
    assert not report.errors, report.errors
    return lake
