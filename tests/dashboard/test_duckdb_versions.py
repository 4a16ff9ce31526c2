"""`evagg query` gives the same answers under DuckDB 1.5 and DuckDB 2 (docs/queries.md,
"DuckDB versions").

The test runs a small CLI scenario twice over one store: with the DuckDB of this
environment and with "the other one" (2.x when this is 1.x, 1.5.5 when this is 2.x).
The other one is $EVAGG_OTHER_DUCKDB (a folder holding a `duckdb` package, put first on
PYTHONPATH), or installed with pip into a temporary folder; the test fails, saying why
and naming EVAGG_OTHER_DUCKDB, when neither works (no package index and no wheel at
hand). To run every dashboard test under the other version, install it in a second
virtual environment
(`pip install -e '.[test]' 'duckdb>=2'`) and run `pytest tests/dashboard` there.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.dashboard.lakegen import at, event, local_put, write_rows, write_sample_store

REPO = Path(__file__).resolve().parents[2]
THIS_MAJOR = int(duckdb.__version__.split(".")[0])
OTHER = "duckdb>=2,<3" if THIS_MAJOR < 2 else "duckdb==1.5.5"
QUERIES = (
    ("summary",),
    ("tasks", "--sort", "task_id", "--asc", "--limit", "100"),
    ("tasks", "--name", "lone"),
    ("steps", "--run", "run1"),
    ("agents",),
    ("sql", "SELECT kind, count(*) AS n, min(time) AS first FROM events GROUP BY ALL "
            "ORDER BY kind"),
)


def other_duckdb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("EVAGG_OTHER_DUCKDB")
    if given:
        return Path(given)
    folder = tmp_path_factory.mktemp("other-duckdb")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--target", str(folder), OTHER],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        why = (f"cannot install {OTHER} to compare with duckdb {duckdb.__version__} "
               f"(set EVAGG_OTHER_DUCKDB to a folder holding it): "
               f"{done.stderr.strip().splitlines()[-1:]}")
        pytest.fail(why)  # the suite's own install needed the same index: a skip proves nothing
    return folder


def run(lake: Path, cache: Path, pythonpath: str, *query: str) -> tuple[str, Any]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "EVAGG_CACHE_DIR": str(cache)}
    probe = subprocess.run(
        [sys.executable, "-c", "import duckdb; print(duckdb.__version__)"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    done = subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(lake),
                           *query, "--json"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (query, done.stderr)
    return probe.stdout.strip(), json.loads(done.stdout)


def same(mine: Any, theirs: Any) -> bool:
    """Equal, floats to 1e-12: DuckDB 2 interpolates quantiles with a fused multiply-add."""
    if isinstance(mine, float) and isinstance(theirs, float):
        return math.isclose(mine, theirs, rel_tol=1e-12)
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return mine.keys() == theirs.keys() and all(same(mine[k], theirs[k]) for k in mine)
    if isinstance(mine, list) and isinstance(theirs, list):
        return len(mine) == len(theirs) and all(map(same, mine, theirs))
    return bool(mine == theirs)


def test_query_answers_match_under_the_other_duckdb(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = other_duckdb(tmp_path_factory)
    lake = tmp_path / "lake"
    write_sample_store(local_put(lake))
    # nanoseconds that round up and down at microseconds, and a task without a task_id
    write_rows(local_put(lake), [
        event(kind="task", name="lone", state="FINISHED", time=at(70) + 999, duration_s=0.8),
        event(kind="task", task_id="ns1", state="RUNNING", time=at(71) + 400),
        event(kind="task", task_id="ns1", state="FINISHED", time=at(71) + 2_600)],
        "part-00030.parquet")
    versions, answers = set(), {}
    for query in QUERIES:
        for_this = run(lake, tmp_path / "cache-this", str(REPO), *query)
        for_other = run(lake, tmp_path / "cache-other", f"{other}{os.pathsep}{REPO}", *query)
        versions |= {for_this[0], for_other[0]}
        assert same(for_this[1], for_other[1]), (query, for_this, for_other)
        answers[query[0]] = answers.get(query[0]) or for_this[1]
    assert len(versions) == 2, versions  # two DuckDB versions really ran
    tasks = {row["task_id"]: row for row in answers["tasks"]}
    assert tasks["ns1"]["duration_s"] == 2e-06  # 400 ns and 2,600 ns cut down, not rounded
    assert [row["duration_s"] for row in tasks.values() if row["name"] == "lone"] == [0.8]


def test_fragments_and_ddl_under_the_other_duckdb(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The other DuckDB builds the task fragments (`evagg compact`), `evagg query` folds
    them to the same tasks as this one, and `evagg query ddl` prints under both (the base
    install, without `[s3]`, gets DuckDB 2)."""
    other = other_duckdb(tmp_path_factory)
    lake = tmp_path / "lake"
    write_sample_store(local_put(lake))
    env = {**os.environ, "PYTHONPATH": f"{other}{os.pathsep}{REPO}"}
    done = subprocess.run([sys.executable, "-m", "aggregator", "compact", str(lake),
                           "--grace", "0"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert any((lake / "_tasks").rglob("*.pq")), done.stdout
    query = ("tasks", "--sort", "task_id", "--asc", "--limit", "1000")
    _, mine = run(lake, tmp_path / "cache-this", str(REPO), *query)
    _, theirs = run(lake, tmp_path / "cache-other", f"{other}{os.pathsep}{REPO}", *query)
    assert same(mine, theirs)
    for pythonpath in (str(REPO), f"{other}{os.pathsep}{REPO}"):
        printed = subprocess.run(
            [sys.executable, "-m", "aggregator", "query", "ddl", "--dialect", "duckdb",
             str(lake)], cwd=REPO, env={**os.environ, "PYTHONPATH": pythonpath},
            capture_output=True, text=True, timeout=120)
        assert printed.returncode == 0, printed.stderr
        assert "CREATE OR REPLACE VIEW tasks" in printed.stdout
        assert printed.stderr == ""  # no library warning reaches the user (DuckDB 2 had one)
