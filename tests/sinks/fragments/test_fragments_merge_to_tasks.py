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
import pyarrow.parquet as pq
import pytest

from sinks.fragments.dialects import dialect
from sinks.fragments.task_fold import attempts_select, merge_select
from sinks.parquet.compact import run_compact
from sinks.parquet.layout import TASKS_ROOT
from tests.agentproc import REPO
from tests.split_task_lake import write_merged_lake


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
    return write_merged_lake(tmp_path / "lake")


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
