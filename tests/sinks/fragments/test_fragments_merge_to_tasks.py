"""Task fragments: the hour merge writes one per node-hour, and the cluster's tasks are one
GROUP BY over the fragments of every node and hour, exactly what dashboard/sql/tasks.sql
gives over the raw events.

The lake is split as a cluster splits it: a Ray attempt's owner events (definition,
PENDING, SUBMITTED, FINISHED/FAILED) on one node and its executor's RUNNING on another, an
attempt that runs across an hour boundary, a retried send that lands twice in one hour,
FAILED with error types, an end evagg inferred and a later real end, a nameless attempt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.ray.events import ray_events_to_rows
from sinks.fragments.dialects import dialect
from sinks.fragments.task_fold import attempts_select, merge_select
from sinks.parquet.compact import run_compact
from sinks.parquet.layout import TASKS_ROOT, object_key
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
        for n, half in enumerate(halves + [table.slice(0, 1)]):  # the last: a resent row
            path = lake / directory / f"part-spoolA-{n:020d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open_writer(path, written_schema(EVENT_SCHEMA)) as writer:
                writer.write_table(half.cast(written_schema(EVENT_SCHEMA), safe=False))
            old = time.time() - 7200
            os.utime(path, (old, old))


def reference_tasks(con: duckdb.DuckDBPyConnection, lake: Path) -> list[tuple[Any, ...]]:
    """tasks.sql over every raw row, duplicates included."""
    con.execute(f"CREATE OR REPLACE VIEW events_raw AS SELECT * FROM read_parquet("
                f"'{lake}/date=*/hour=*/node=*/*.parquet', union_by_name = true)")
    con.execute((REPO / "dashboard" / "sql" / "tasks.sql").read_text())
    return sorted(con.execute("SELECT * EXCLUDE (session) FROM task_attempts").fetchall(),
                  key=repr)


def merged_tasks(con: duckdb.DuckDBPyConnection, lake: Path) -> list[tuple[Any, ...]]:
    d = dialect("duckdb")
    con.execute(f"CREATE OR REPLACE VIEW fragments AS SELECT * FROM read_parquet("
                f"'{lake}/{TASKS_ROOT}/*/*/*/*.pq')")
    con.execute(f"CREATE OR REPLACE VIEW merged AS {merge_select(d, 'fragments')}")
    return sorted(con.execute(attempts_select(d, "merged")).fetchall(), key=repr)


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    write_lake(root, ray_rows() + evagg_rows())
    report = run_compact(str(root), grace_s=0.0)
    assert not report.errors, report.errors
    return root


def test_fragments_of_every_node_hour_merge_to_what_tasks_sql_gives(lake: Path) -> None:
    con = duckdb.connect()
    fragments = sorted(p.relative_to(lake).parts[1:4]
                       for p in (lake / TASKS_ROOT).rglob("*.pq"))
    assert len(fragments) == 4  # two nodes, two hours
    reference = reference_tasks(con, lake)
    assert len(reference) > 50
    assert merged_tasks(con, lake) == reference


def test_a_ray_attempt_split_over_two_nodes_is_one_row_with_both_halves(lake: Path) -> None:
    con = duckdb.connect()
    merged_tasks(con, lake)
    split = con.execute(
        f"SELECT count(*) FROM ({attempts_select(dialect('duckdb'), 'merged')}) "
        "WHERE running_at IS NOT NULL AND (finished_at IS NOT NULL OR failed_at IS NOT NULL)"
        " AND source = 'ray'").fetchone()
    assert split is not None and split[0] > 0


def test_a_second_merge_of_an_hour_replaces_its_fragment(lake: Path) -> None:
    hour = next(p for p in lake.glob("date=*/hour=*/node=*") if p.is_dir())
    late = hour / "part-spoolB-00000000000000000000.parquet"
    pq.write_table(pq.read_table(next(hour.glob("compacted-*.parquet"))).slice(0, 1), late)
    old = time.time() - 7200
    os.utime(late, (old, old))
    before = {p.relative_to(lake) for p in (lake / TASKS_ROOT).rglob("*.pq")}
    assert not run_compact(str(lake), grace_s=0.0).errors
    after = {p.relative_to(lake) for p in (lake / TASKS_ROOT).rglob("*.pq")}
    assert len(after) == len(before) == 4  # one per node-hour
    assert len(after - before) == 1  # the merged hour's, renamed after its new file
    con = duckdb.connect()
    assert merged_tasks(con, lake) == reference_tasks(con, lake)


def test_an_old_compacted_hour_gets_its_missing_fragment(lake: Path) -> None:
    fragment = next((lake / TASKS_ROOT).rglob("*.pq"))
    fragment.unlink()
    report = run_compact(str(lake), grace_s=0.0)
    assert sum(p.fragments for p in report.partitions) == 1
    assert fragment.exists()
    con = duckdb.connect()
    assert merged_tasks(con, lake) == reference_tasks(con, lake)
