"""On a local lake the fold reads the task fragments where they are (dashboard/lake/
fold_place.py): a first open stores only the attempts it had to merge, answers as tasks.sql
over every raw event, and copies the rest into its cache when the store closes (or, for
the dashboard, in a thread). Through a later raw file that finishes an attempt a fragment
holds, and a fragment that vanishes or is rewritten while it is read in place.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aggregator.decode.normalize import Stamp, rows_to_batch
from dashboard.lake.store import Store, StoreOptions
from sinks.parquet.layout import TASKS_ROOT, object_key
from sinks.parquet.writer import open_writer, written_schema
from sinks.schema import EVENT_SCHEMA
from tests.dashboard.fold_checks import assert_same
from tests.split_task_lake import HOUR_NS, OWNER, T0, write_merged_lake

KEY = ["task_id", "attempt", "session"]


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return write_merged_lake(tmp_path / "lake")


def fragments(lake: Path) -> list[Path]:
    return sorted((lake / TASKS_ROOT).rglob("*.pq"))


def attempts(lake: Path) -> tuple[int, int]:
    """(attempts in more than one fragment, attempts in all), from the fragments."""
    rows = pa.concat_tables([pq.read_table(f, columns=KEY) for f in fragments(lake)])
    counts = rows.group_by(KEY).aggregate([([], "count_all")]).column("count_all")
    return sum(1 for c in counts.to_pylist() if c > 1), len(counts)


def held(store: Store) -> dict[str, int]:
    found = store.execute(
        "SELECT (SELECT count(*) FROM fold.task_fold), (SELECT count(*) FROM fold.placed), "
        "(SELECT count(*) FROM fold_tasks)", views=False).rows[0]
    return dict(zip(("stored", "placed", "visible"), found, strict=True))


def cached(lake: Path, cache: Path, **options: Any) -> Store:
    return Store(StoreOptions(str(lake), refresh_s=0.0, cache_dir=str(cache), **options))


def scratch(lake: Path) -> Store:
    return Store(StoreOptions(str(lake), refresh_s=0.0, fold=False))


def write_raw(lake: Path, rows: list[dict[str, Any]], received: int, name: str) -> Path:
    """One part file of `rows` on the owner node, as the agent's sink writes it."""
    batch = rows_to_batch(rows, Stamp(received_ns=received, node_id=OWNER)).batch
    path = lake / object_key(received, OWNER, "spoolB", 0).rsplit("/", 1)[0] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_batches([batch], schema=EVENT_SCHEMA)
    with open_writer(path, written_schema(EVENT_SCHEMA)) as writer:
        writer.write_table(table.cast(written_schema(EVENT_SCHEMA), safe=False))
    old = time.time() - 7200
    os.utime(path, (old, old))
    return path


def finishing(task_id: str, event_id: str) -> dict[str, Any]:
    """A FINISHED event, two hours after the lake's first, of an attempt whose RUNNING a
    fragment holds (the split lake's t003 never ends)."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((T0 + 2 * HOUR_NS) // 10**9 + 60))
    return {"kind": "task", "task_id": task_id, "name": "fn_3", "job_id": "j1",
            "event_id": event_id, "state": "FINISHED", "time": at, "duration_s": 4.0}


def test_a_first_open_stores_only_the_attempts_it_merged(lake: Path, tmp_path: Path) -> None:
    twice, total = attempts(lake)
    assert twice > 0  # Ray's owner and executor halves: two nodes' fragments
    store, reference = cached(lake, tmp_path / "cache"), scratch(lake)
    assert_same(store, reference)
    assert store.fold is not None and store.fold.fragment_files == 4
    assert held(store) == {"stored": twice, "placed": 4, "visible": total}
    store.close()  # copies the rest into the cache for the next process
    again = cached(lake, tmp_path / "cache")
    assert held(again) == {"stored": total, "placed": 0, "visible": total}
    assert_same(again, reference)
    assert again.fold is not None and again.fold.rebuilds == 0
    for s in (again, reference):
        s.close()


def test_a_memory_fold_reads_in_place_and_copies_nothing_at_close(lake: Path) -> None:
    store, reference = Store(StoreOptions(str(lake), refresh_s=0.0)), scratch(lake)
    assert_same(store, reference)
    assert held(store)["placed"] == 4
    for s in (store, reference):
        s.close()


def test_a_later_raw_file_merges_with_the_attempt_a_fragment_holds(lake: Path,
                                                                   tmp_path: Path) -> None:
    store, reference = cached(lake, tmp_path / "cache"), scratch(lake)
    assert_same(store, reference)
    before = held(store)
    # read in place, then finished by a raw file of a later hour (the incremental merge)
    write_raw(lake, [finishing("t003", "late-end")], T0 + 2 * HOUR_NS, "part-late-1.parquet")
    assert_same(store, reference)
    assert store.execute("SELECT final_state, events FROM tasks WHERE task_id = 't003'",
                         views=False).rows == [["FINISHED", 2]]
    assert held(store) == {**before, "stored": before["stored"] + 1}
    # a first open that finds the raw file already there merges it the same way
    fresh = cached(lake, tmp_path / "other")
    assert_same(fresh, reference)
    assert held(fresh) == held(store)
    for s in (store, reference, fresh):
        s.close()


def test_a_dashboard_copies_the_fragments_into_its_cache_in_a_thread(lake: Path,
                                                                     tmp_path: Path) -> None:
    store = cached(lake, tmp_path / "cache", persist_in_background=True)
    reference = scratch(lake)
    store.refresh(views=False)
    assert store._persister is not None
    store._persister.join(timeout=60)
    _, total = attempts(lake)
    assert held(store) == {"stored": total, "placed": 0, "visible": total}
    assert_same(store, reference)
    for s in (store, reference):
        s.close()


@pytest.mark.parametrize("change", ["deleted", "rewritten"])
def test_a_fragment_read_in_place_that_changes_rebuilds_the_fold(
        change: str, lake: Path, tmp_path: Path) -> None:
    store, reference = cached(lake, tmp_path / "cache"), scratch(lake)
    assert_same(store, reference)
    victim = fragments(lake)[0]
    if change == "deleted":  # its compacted file is then folded from its rows
        victim.unlink()
    else:  # the same rows, another size
        pq.write_table(pq.read_table(victim), victim, compression="none")
    assert_same(store, reference)
    assert store.fold is not None and store.fold.rebuilds == 1
    for s in (store, reference):
        s.close()


def test_a_fragment_gone_between_opens_before_its_copy_rebuilds(lake: Path,
                                                                tmp_path: Path) -> None:
    store, reference = cached(lake, tmp_path / "cache"), scratch(lake)
    assert_same(store, reference)
    store._con.close()  # the process died before closing the store: nothing copied
    fragments(lake)[-1].unlink()
    again = cached(lake, tmp_path / "cache")
    assert_same(again, reference)
    assert again.fold is not None and again.fold.rebuilds == 1
    for s in (again, reference):
        s.close()
