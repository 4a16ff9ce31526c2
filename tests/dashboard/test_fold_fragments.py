"""The readers take the agent's task fragments for the hours that have them.

`evagg query` and `evagg dashboard` fold a compacted file from its task fragment (one row
per attempt, written at the hour merge) instead of its rows, and fold raw events only for
the rest: the tasks, the summary and the overview are exactly what tasks.sql gives over
every raw event, through a late file merged into an hour again and a lost fragment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dashboard.lake.store import Store, StoreOptions
from sinks.parquet.compact import run_compact
from sinks.parquet.layout import TASKS_ROOT
from tests.agentproc import REPO
from tests.dashboard.fold_checks import TASKS_SQL, assert_same
from tests.dashboard.httpfs import needs_httpfs
from tests.sinks.moto_server import MotoS3, aws_env
from tests.split_task_lake import split_lake_rows, write_lake


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    write_lake(root, split_lake_rows())
    return root


def compact(root: Path) -> None:
    report = run_compact(str(root), grace_s=0.0)
    assert not report.errors, report.errors


def test_a_first_open_folds_the_fragments_and_answers_as_tasks_sql(lake: Path,
                                                                   tmp_path: Path) -> None:
    compact(lake)
    cached = Store(StoreOptions(str(lake), refresh_s=0.0, cache_dir=str(tmp_path / "cache")))
    scratch = Store(StoreOptions(str(lake), refresh_s=0.0, fold=False))
    assert_same(cached, scratch)
    assert cached.fold is not None
    assert cached.fold.fragment_files == 4  # every node-hour, none of its rows read
    assert cached.fold.rebuilds == 0
    cached.close()
    scratch.close()


def test_raw_hours_beside_fragment_hours_and_an_hour_merged_again(lake: Path,
                                                                  tmp_path: Path) -> None:
    compact(lake)
    # a new hour the agent has not merged yet: raw files only
    newest = sorted(lake.glob("date=*/hour=*/node=*"))[-1]
    later = Path(str(newest).replace("hour=04", "hour=05"))
    later.mkdir(parents=True)
    compacted = next(newest.glob("compacted-*.parquet"))
    table = pq.read_table(compacted)
    # new events of attempts the fragments hold (a copy of an event already in another
    # node-hour would count twice in `events`: docs/queries.md says so)
    again = table.slice(0, 5)
    renamed = pc.binary_join_element_wise("new-", again.column("event_id"), "")
    again = again.set_column(again.schema.get_field_index("event_id"), "event_id", renamed)
    pq.write_table(again, later / "part-spoolA-00000000000000000900.parquet")
    cached = Store(StoreOptions(str(lake), refresh_s=0.0, cache_dir=str(tmp_path / "cache")))
    scratch = Store(StoreOptions(str(lake), refresh_s=0.0, fold=False))
    assert_same(cached, scratch)
    assert cached.fold is not None and cached.fold.fragment_files == 4
    # a late file lands in a merged hour, the hour is merged again: new file, new fragment
    late = newest / "part-spoolB-00000000000000000000.parquet"
    pq.write_table(table.slice(5, 3), late)
    old = time.time() - 7200
    os.utime(late, (old, old))
    compact(lake)
    assert_same(cached, scratch)
    # its fragment lost (a reader racing the merge): the fold reads the rows, once
    next((lake / TASKS_ROOT).rglob("*.pq")).unlink()
    fresh = Store(StoreOptions(str(lake), refresh_s=0.0, cache_dir=str(tmp_path / "other")))
    assert_same(fresh, scratch)
    for store in (cached, scratch, fresh):
        store.close()


def test_ends_inferred_from_facts_in_merged_hours_are_the_same(tmp_path: Path) -> None:
    # A fragment hour's facts (a worker's and a node's death, an agent's heartbeat) come
    # from its rows' few columns: the attempts they end read FAILED just as from scratch.
    T0 = 1_767_322_800
    def at(seconds: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + seconds))

    facts = [
        {"kind": "task", "task_id": "on-dead-worker", "name": "hold", "state": "RUNNING",
         "worker_id": "w-dead", "event_id": "odw", "time": at(30)},
        {"kind": "worker", "worker_id": "w-dead", "state": "DEAD", "event_id": "wd",
         "time": at(60)},
        {"kind": "task", "task_id": "on-dead-node", "name": "hold", "state": "PENDING",
         "node_id": "n-dead", "event_id": "odn", "time": at(40)},
        {"kind": "node", "node_id": "n-dead", "state": "DEAD", "event_id": "nd",
         "time": at(70)},
        {"kind": "agent", "name": "heartbeat", "state": "RUNNING", "event_id": "hb",
         "host": "owner-host", "time": at(80), "attrs": {"silent_after_s": "600"}},
    ]
    root = tmp_path / "lake"
    write_lake(root, split_lake_rows() + facts)
    compact(root)
    cached = Store(StoreOptions(str(root), refresh_s=0.0, cache_dir=str(tmp_path / "cache")))
    scratch = Store(StoreOptions(str(root), refresh_s=0.0, fold=False))
    assert_same(cached, scratch)
    assert cached.fold is not None and cached.fold.fragment_files == 4
    ended = cached.execute("SELECT task_id, final_state, error_type FROM tasks "
                           "WHERE name = 'hold' ORDER BY task_id").rows
    assert ended == [["on-dead-node", "FAILED", "NODE_DIED"],
                     ["on-dead-worker", "FAILED", "WORKER_DIED"]]
    cached.close()
    scratch.close()


def test_evagg_query_gives_the_same_tasks_with_and_without_fragments(lake: Path,
                                                                     tmp_path: Path) -> None:
    def tasks(cache: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "aggregator", "query", "sql", "--data", str(lake),
             "--cache", str(tmp_path / cache),
             "SELECT name, final_state, count(*), sum(duration_s), sum(events) FROM tasks "
             "GROUP BY ALL ORDER BY ALL"],
            capture_output=True, text=True, cwd=REPO, timeout=120,
            env={**os.environ, "HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    raw = tasks("raw")
    compact(lake)
    assert any((lake / TASKS_ROOT).rglob("*.pq"))
    with_fragments = tasks("fragments")
    assert with_fragments == raw
    assert "fn_1" in raw and "FAILED" in raw


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.mark.parametrize("engine", [pytest.param("httpfs", marks=needs_httpfs), "pyarrow"])
def test_on_s3_the_fragments_are_read_by_either_engine(
        engine: str, moto: MotoS3, lake: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    bucket = moto.create_bucket()
    compact(lake)
    client = moto.client()
    for path in lake.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"lake/{path.relative_to(lake).as_posix()}")
    cached = Store(StoreOptions(f"s3://{bucket}/lake/", endpoint_url=moto.endpoint_url,
                                region="us-east-1", engine=engine, refresh_s=0.0,
                                cache_dir=str(tmp_path / "cache")))
    scratch = Store(StoreOptions(str(lake), refresh_s=0.0, fold=False))
    assert cached.execute(TASKS_SQL).rows == scratch.execute(TASKS_SQL).rows
    assert cached.fold is not None and cached.fold.fragment_files == 4
    cached.close()
    scratch.close()
