"""`evagg query ddl --dialect duckdb` run in a plain DuckDB connection (no evagg code) over
a lake two real agents wrote gives the events, times, maps and tasks of `evagg query`:
first with raw files only, then with the owner node's hours compacted into a merged file
and a task fragment each while the other node's stay raw."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.sinks.fragments.ddl_lake import (
    QUESTIONS,
    assert_same,
    compacted_copy,
    compacted_copy_with_a_late_file,
    ddl,
    evagg_answers,
    evagg_json,
    normal,
    two_agent_lake,
)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with two_agent_lake(tmp_path_factory.mktemp("ddl-duckdb")) as path:
        yield path


def answers(lake: Path) -> tuple[duckdb.DuckDBPyConnection, dict[str, list[tuple[Any, ...]]]]:
    con = duckdb.connect()
    for statement in ddl("duckdb", lake):
        con.execute(statement)

    def run(sql: str) -> list[dict[str, Any]]:
        cursor = con.execute(sql)
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    return con, {name: normal(run(sql.format(us="epoch_us"))) for name, sql in QUESTIONS.items()}


def same_as_evagg(lake: Path) -> duckdb.DuckDBPyConnection:
    con, got = answers(lake)
    assert_same(got, evagg_answers(lake), evagg_json(lake, "tasks", "--limit", "100000"))
    return con


def test_raw_files_only(lake: Path) -> None:
    assert not (lake / "_tasks").exists()
    con = same_as_evagg(lake)
    assert con.execute("SELECT count(*) FROM task_fragments").fetchone() == (0,)


def test_fragments_for_one_node_raw_files_for_the_other(lake: Path, tmp_path: Path) -> None:
    lake = compacted_copy(lake, tmp_path)
    con = same_as_evagg(lake)
    nodes = dict(con.execute("SELECT node, count(*) FROM task_fragments GROUP BY ALL").fetchall())
    assert set(nodes) == {"node-owner"}
    # an attempt whose RUNNING is in the executor's raw files and its end in the owner's
    # fragment
    split = con.execute("SELECT final_state, duration_s FROM tasks WHERE task_id = 'split0'")
    assert split.fetchall() == [("FINISHED", 2.0)]  # 60.000000250 s to 62.000000750 s, in µs


def test_a_part_file_written_after_its_hour_s_merge_is_folded_beside_the_fragment(
        lake: Path, tmp_path: Path) -> None:
    # the fragment covers the merged file only: the late file's tasks are not dropped
    same_as_evagg(compacted_copy_with_a_late_file(lake, tmp_path))
