"""Parquet times in microseconds, as a user meets them: what a real agent writes, lakes
that mix older nanosecond files with new ones read through `evagg query`, and
`evagg compact` (with and without `--rewrite-types`) over such lakes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sinks.parquet.writer import open_writer
from tests.agentproc import REPO, AgentProcess
from tests.dashboard.lakegen import local_put, write_sample_store

TIMES = ("time", "received")
# 2026-01-02T03:04:05.123456789Z: the last three digits are below a microsecond
SENT_NS = 1_767_323_045_123_456_789


def evagg(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, f"evagg {' '.join(args)}: {done.stderr}"
    return done


def lake_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))


def time_units(path: Path) -> dict[str, tuple[str, bool]]:
    """`time` and `received` of a file's Parquet schema: (unit, isAdjustedToUTC)."""
    schema = pq.ParquetFile(path).schema
    found = {}
    for index in range(len(schema)):
        column = schema.column(index)
        if column.name in TIMES:
            logical = column.logical_type.to_json()
            assert column.physical_type == "INT64", column
            parsed = json.loads(logical)
            found[column.name] = (parsed["timeUnit"], parsed["isAdjustedToUTC"])
    return found


MICROS_UTC = {"time": ("microseconds", True), "received": ("microseconds", True)}
NANOS_UTC = {"time": ("nanoseconds", True), "received": ("nanoseconds", True)}


# -- a real agent -------------------------------------------------------------------

def test_a_real_agent_writes_microsecond_utc_times_floored(agent: AgentProcess) -> None:
    """Spark 4, pyiceberg, Trino and Athena read TIMESTAMP(MICROS, UTC); nanoseconds sent
    come back cut down to the microsecond, never rounded up."""
    body = json.dumps({"kind": "task", "name": "precise", "time": SENT_NS}).encode()
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status in (200, 202)
    agent.wait_rows("SELECT 1 FROM events WHERE name = 'precise'", 1)
    assert agent.stop() == 0
    files = lake_files(agent.lake_dir)
    assert files
    for path in files:
        assert time_units(path) == MICROS_UTC, path
        schema = pq.read_schema(path)
        assert schema.field("time").type == pa.timestamp("us", tz="UTC")
        assert schema.field("received").type == pa.timestamp("us", tz="UTC")
    table = pa.concat_tables(pq.read_table(p) for p in files)
    rows = table.filter(pc.equal(table["name"], "precise"))
    assert rows["time"].cast(pa.int64()).to_pylist() == [SENT_NS // 1000]
    [received] = rows["received"].cast(pa.int64()).to_pylist()
    assert abs(received / 1e6 - time.time()) < 600


# -- lakes of old and new files ---------------------------------------------------------

def old_lake(root: Path) -> list[Path]:
    """The sample store as evagg wrote it before: nanosecond times, here with digits below
    the microsecond (a different one on each row), written with pyarrow's defaults."""
    write_sample_store(local_put(root))
    files = lake_files(root)
    for path in files:
        table = pq.read_table(path)
        extra = pa.array([(index * 337 + 123) % 1000 for index in range(table.num_rows)],
                         pa.int64())
        for name in TIMES:
            nanos = pc.add(table[name].cast(pa.int64()), extra)
            column = nanos.cast(table.schema.field(name).type)
            table = table.set_column(table.schema.get_field_index(name), name, column)
        pq.write_table(table, path, compression="zstd")
        assert time_units(path) == NANOS_UTC
    return files


def to_micros(path: Path) -> None:
    """Rewrite one file as the sink writes today (sinks/parquet/writer.py)."""
    table = pq.read_table(path)
    with open_writer(path, table.schema) as writer:
        writer.write_table(table)
    assert time_units(path) == MICROS_UTC


@pytest.fixture(scope="module")
def lakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same events three ways: every file old, every file new, every other file new."""
    base = tmp_path_factory.mktemp("lakes")
    old = base / "old"
    old_lake(old)
    made = {"old": old}
    for kind in ("new", "mixed"):
        made[kind] = base / kind
        shutil.copytree(old, made[kind])
        for index, path in enumerate(lake_files(made[kind])):
            if kind == "new" or index % 2 == 0:
                to_micros(path)
    units = {time_units(p)["time"][0] for p in lake_files(made["mixed"])}
    assert units == {"nanoseconds", "microseconds"}
    return made


QUERIES: list[tuple[str, ...]] = [
    ("sql", "SELECT event_id, kind, state, task_id, time, received, date, hour, node "
            "FROM events_raw ORDER BY event_id, received, node"),
    ("sql", "SELECT event_id, time, received FROM events ORDER BY time, event_id"),
    ("sql", "SELECT kind, min(time) AS first, max(received) AS last, "
            "epoch_us(max(time)) - epoch_us(min(time)) AS span_us FROM events GROUP BY kind "
            "ORDER BY kind"),
    ("sql", "SELECT * FROM tasks ORDER BY task_id, attempt"),
    ("summary",),
    ("tasks", "--since", "2025-03-01T10:00:00", "--until", "2025-03-01T11:00:00",
     "--limit", "1000"),
    ("steps", "--run", "run1"),
    ("agents",),
]


FOLDED = [q for q in QUERIES if q[0] in ("summary", "tasks")]  # the task fold's cache
DEDUPLICATED = [QUERIES[1], ("summary",)]  # not events_raw: a merge drops duplicates


def answers(lake: Path, cache: Path | None = None,
            queries: list[tuple[str, ...]] = QUERIES) -> dict[str, Any]:
    cached = ["--cache", str(cache)] if cache else ["--no-cache"]
    found = {}
    for args in queries:
        done = evagg("query", "--data", str(lake), *cached, "--json", *args)
        found[" ".join(args)] = json.loads(done.stdout)
    return found


@pytest.mark.slow  # 30 runs of evagg query
def test_evagg_query_answers_the_same_over_old_new_and_mixed_files(
        lakes: dict[str, Path], tmp_path: Path) -> None:
    """Every view works in microseconds: old nanosecond files, new microsecond ones and a
    lake of both give the same answers, through the task fold's cache too."""
    new = answers(lakes["new"])
    assert new["summary"] and len(new[" ".join(QUERIES[5])]) == 17  # lakegen.Expected.tasks
    first = new["sql SELECT event_id, time, received FROM events ORDER BY time, event_id"][0]
    assert first["time"].endswith("Z") and len(first["time"].split(".")[1]) == 7  # µs + Z
    for kind in ("old", "mixed"):
        assert answers(lakes[kind]) == new, kind
    folded = {" ".join(q): new[" ".join(q)] for q in FOLDED}
    for kind in ("new", "old", "mixed"):  # the incremental fold, file by file
        assert answers(lakes[kind], tmp_path / f"cache-{kind}", FOLDED) == folded, kind


def test_the_times_read_back_are_the_old_ones_floored(lakes: dict[str, Path]) -> None:
    old = pa.concat_tables(pq.read_table(p) for p in lake_files(lakes["old"]))
    sql = "SELECT event_id, epoch_us(time) AS t, epoch_us(received) AS r FROM events_raw"
    done = evagg("query", "--data", str(lakes["mixed"]), "--no-cache", "--json", "sql", sql)
    read = sorted((row["event_id"], row["t"], row["r"]) for row in json.loads(done.stdout))
    ns = zip(old["event_id"].to_pylist(), old["time"].cast(pa.int64()).to_pylist(),
             old["received"].cast(pa.int64()).to_pylist(), strict=True)
    assert read == sorted((e, t // 1000, r // 1000) for e, t, r in ns)
    assert any(t % 1000 for t in old["time"].cast(pa.int64()).to_pylist())  # digits cut


# -- evagg compact ----------------------------------------------------------------------

def rows_of(root: Path) -> dict[str, dict[str, Any]]:
    """Every row by event_id (the first copy), time and received as integer microseconds
    (an old file's nanoseconds floored)."""
    seen: dict[str, dict[str, Any]] = {}
    for path in lake_files(root):
        table = pq.read_table(path)
        for name in TIMES:
            ints = table[name].cast(pa.int64())
            if table.schema.field(name).type.unit == "ns":
                ints = pc.divide(ints, 1000)  # integer division: the floor, after 1970
            table = table.set_column(table.schema.get_field_index(name), name, ints)
        for row in table.to_pylist():
            seen.setdefault(row["event_id"], row)
    return seen


def test_compact_merges_a_mixed_hour_into_microseconds(lakes: dict[str, Path],
                                                       tmp_path: Path) -> None:
    lake = tmp_path / "mixed"
    shutil.copytree(lakes["mixed"], lake)
    before = rows_of(lakes["old"])
    alone = lake / "date=2025-03-01/hour=10/node=unknown/part-00003.parquet"
    assert time_units(alone) == NANOS_UTC  # a partition of one file: no merge
    done = evagg("compact", str(lake), "--grace", "0")
    assert "merged 7 files into 2; deleted 7; 0 errors" in done.stdout, done.stdout
    merged = [p for p in lake_files(lake) if p != alone]
    assert len(merged) == 2 and all(p.name.startswith("compacted-") for p in merged)
    assert all(time_units(p) == MICROS_UTC for p in merged)
    assert time_units(alone) == NANOS_UTC
    assert rows_of(lake) == before
    assert answers(lake, queries=DEDUPLICATED) == answers(lakes["new"], queries=DEDUPLICATED)


def test_compact_rewrite_types_converts_an_old_lake(tmp_path: Path) -> None:
    lake = tmp_path / "old"
    old_lake(lake)
    before = rows_of(lake)
    # without the flag a partition of one file (node=unknown) keeps its nanoseconds
    evagg("compact", str(lake), "--grace", "0")
    left = [p for p in lake_files(lake) if time_units(p) == NANOS_UTC]
    assert [p.parent.name for p in left] == ["node=unknown"]
    files = lake_files(lake)
    listed = evagg("compact", str(lake), "--grace", "0", "--rewrite-types", "--dry-run")
    assert "would merge 1 files into 1" in listed.stdout, listed.stdout
    assert "node=unknown: 1 files -> compacted-" in listed.stdout
    assert lake_files(lake) == files and time_units(left[0]) == NANOS_UTC
    done = evagg("compact", str(lake), "--grace", "0", "--rewrite-types")
    assert "merged 1 files into 1; deleted 1; 0 errors" in done.stdout, done.stdout
    files = lake_files(lake)
    assert all(time_units(p) == MICROS_UTC for p in files)
    assert all(p.name.startswith("compacted-") for p in files)
    assert rows_of(lake) == before  # the same rows, times cut to the microsecond
    again = evagg("compact", str(lake), "--grace", "0", "--rewrite-types")
    assert "merged 0 files into 0; deleted 0; 0 errors" in again.stdout, again.stdout
    assert lake_files(lake) == files


def test_rewrite_types_rewrites_an_old_compacted_file_alone(tmp_path: Path) -> None:
    """An hour `evagg compact` merged before microseconds: one compacted file with
    nanoseconds, which a plain run leaves alone and --rewrite-types replaces, keeping its
    cover list (so a copy of an original still lying about is deleted as covered)."""
    from sinks.parquet.compact import run_compact

    lake = tmp_path / "lake"
    old_lake(lake)
    partition = lake_files(lake)[0].parent
    run_compact(str(lake), partition="/".join(partition.relative_to(lake).parts[:2]),
                grace_s=0)
    [merged] = lake_files(partition)
    table = pq.read_table(merged)  # as older evagg wrote it: nanoseconds, same metadata
    schema = pa.schema([f.with_type(pa.timestamp("ns", tz="UTC")) if f.name in TIMES else f
                        for f in table.schema], metadata=table.schema.metadata)
    pq.write_table(table.cast(schema), merged)
    covers = pq.read_metadata(merged).metadata[b"evagg.compacted"]
    assert time_units(merged) == NANOS_UTC
    before = rows_of(partition)
    plain = run_compact(str(lake), grace_s=0)
    assert plain.written_files == 0 and lake_files(partition) == [merged]
    report = run_compact(str(lake), grace_s=0, rewrite_types=True)
    assert report.errors == []
    [rewritten] = lake_files(partition)
    assert rewritten != merged and time_units(rewritten) == MICROS_UTC
    assert json.loads(pq.read_metadata(rewritten).metadata[b"evagg.compacted"])["covers"] == \
        json.loads(covers)["covers"]
    assert rows_of(partition) == before
