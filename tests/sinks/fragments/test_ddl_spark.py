"""`evagg query ddl --dialect spark`, run by a real Spark (pyspark in local mode) over a
lake two real agents wrote, gives what `evagg query` gives: the events per (kind, state),
their times to the microsecond (cut down from the producers' nanoseconds), the values of
the metrics and attrs maps and `nonfinite`, and the tasks per (name, final state) with
their durations, Ray's attempts split over two nodes included. Once over raw files only,
then with the owner node's hours compacted into a merged file and a task fragment each,
and once more with a part file written into a merged hour after its merge.

Spark reads only TIMESTAMP(MICROS) Parquet times: the lake is written as agents write it
since evagg stopped writing nanoseconds.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sinks.fragments.ddl_lake import (
    QUESTIONS,
    assert_same,
    compacted_copy_with_a_late_file,
    ddl,
    evagg,
    evagg_answers,
    evagg_json,
    normal,
    two_agent_lake,
    us_of,
)

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # Spark on two cores: minutes


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    assert shutil.which("java"), ("java is missing: apt-get install openjdk-17-jre-headless "
                                  "(the README's test command)")
    from pyspark.sql import SparkSession

    scratch = tmp_path_factory.mktemp("spark")
    session = (SparkSession.builder.master("local[1]").appName("evagg-ddl")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.local.dir", str(scratch / "local"))
               .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
               .config("spark.driver.extraJavaOptions",
                       f"-Dderby.system.home={scratch / 'derby'}")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with two_agent_lake(tmp_path_factory.mktemp("ddl-spark")) as path:
        yield path


def spark_answers(spark: Any, lake: Path) -> dict[str, list[tuple[Any, ...]]]:
    for statement in ddl("spark", lake):  # as a user pastes them, one spark.sql() each
        spark.sql(statement)
    return {name: normal([row.asDict() for row in spark.sql(sql.format(us="unix_micros"))
                          .collect()]) for name, sql in QUESTIONS.items()}


def same_as_evagg(spark: Any, lake: Path) -> dict[str, list[tuple[Any, ...]]]:
    started = time.monotonic()
    got = spark_answers(spark, lake)
    print(f"Spark: the statements and {len(QUESTIONS)} questions in "
          f"{time.monotonic() - started:.1f}s")
    assert_same(got, evagg_answers(lake), evagg_json(lake, "tasks", "--limit", "100000"))
    return got


def test_raw_files_only(spark: Any, lake: Path) -> None:
    assert not (lake / "_tasks").exists()
    got = same_as_evagg(spark, lake)
    assert spark.sql("SELECT count(*) AS n FROM task_fragments").first().n == 0
    # the lake holds the cases: times with nanoseconds cut to the microsecond, NaN by
    # name, FAILED with error types, Ray's attempts
    times = {row[0]: row[3] for row in got["events"]}
    spelled = {e: us_of(e) for e in times if us_of(e) is not None}
    assert len(spelled) > 20 and all(times[e] == us for e, us in spelled.items())
    assert any(str(t % 1_000_000).endswith("456") for t in spelled.values())  # not rounded
    assert ("grad_norm",) in {row[-1] for row in got["events"]}
    states = {(r[4], r[6]) for r in got["tasks"]}
    assert {("FAILED", "ValueError"), ("FAILED", "KeyError")} <= states
    assert any(r[2] for r in got["tasks"])  # a Ray session: Ray's attempts are there


def test_fragments_for_one_node_raw_files_for_the_other(spark: Any, lake: Path,
                                                        tmp_path: Path) -> None:
    # and a part file written into a merged hour after its merge, which its fragment does
    # not cover (input_file_name() tells them apart): one Spark run for both
    lake = compacted_copy_with_a_late_file(lake, tmp_path)
    same_as_evagg(spark, lake)
    nodes = {r.node for r in spark.sql("SELECT DISTINCT node FROM task_fragments").collect()}
    assert nodes == {"node-owner"}
    split = spark.sql("SELECT final_state, duration_s FROM tasks WHERE task_id = 'split0'")
    assert [tuple(r) for r in split.collect()] == [("FINISHED", 2.0)]


def test_an_older_nanosecond_lake_reads_in_spark_after_evagg_compact(
        spark: Any, tmp_path: Path) -> None:
    """A lake evagg wrote before microseconds: Spark refuses it, `evagg compact
    --rewrite-types` converts it, then the printed statements read it, times floored."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sinks.schema import EVENT_SCHEMA

    lake = tmp_path / "old"
    base = 1_767_322_800_000_000_000  # 2026-01-02 03:00 UTC
    nanos = [base + i * 1_000_001_789 for i in range(6)]
    rows = [{"event_id": f"old{i}", "kind": "task", "task_id": f"t{i // 2}",
             "state": "RUNNING" if i % 2 == 0 else "FINISHED", "name": "old_fn",
             "time": nanos[i], "received": nanos[i]} for i in range(6)]
    table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)  # nanoseconds, as before
    path = lake / "date=2026-01-02" / "hour=03" / "node=n1" / "part-old-0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(table, path)
    with pytest.raises(Exception, match="NANOS"):
        spark.read.parquet(str(lake)).collect()
    evagg("compact", "--rewrite-types", "--grace", "0", str(lake))
    for statement in ddl("spark", lake):
        spark.sql(statement)
    got = {r.event_id: r.us for r in spark.sql(
        "SELECT event_id, unix_micros(time) AS us FROM events").collect()}
    assert got == {f"old{i}": nanos[i] // 1000 for i in range(6)}
    tasks = spark.sql("SELECT name, final_state, count(*) AS n FROM tasks GROUP BY ALL")
    assert [tuple(r) for r in tasks.collect()] == [("old_fn", "FINISHED", 3)]
