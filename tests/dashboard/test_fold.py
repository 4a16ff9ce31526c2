"""The incremental task fold (dashboard/lake/fold.py) against tasks.sql folding from scratch.

Every check compares a Store that folds file by file into a cache with one that runs
tasks.sql over every event (fold=False), on a generated store whose task events are
split over files, out of order and partly duplicated: after the first fold, after
files are added, after compaction, and after files are deleted.
"""

from __future__ import annotations

import random
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

import dashboard.lake.fold as fold_module
import dashboard.lake.fold_files as fold_files
from dashboard.lake.fold import cache_file
from dashboard.lake.listing import Listing
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions import queries
from sinks.parquet.compact import run_compact
from tests.commands import evagg, in_process
from tests.dashboard.fold_checks import assert_same
from tests.dashboard.lakegen import Row, at, event, local_put, task_events, write_rows


def random_attempts(rng: random.Random, count: int, prefix: str) -> list[Row]:
    """Task attempts cut into pieces, some pieces sent twice, with Ray sessions, errors
    and events that carry no name or a state out of order."""
    rows: list[Row] = []
    for i in range(count):
        end = rng.choice(["FINISHED", "FAILED", None])
        error = ("ValueError", f"bad {i}", f"Traceback {i}") if end == "FAILED" else None
        pieces = task_events(f"{prefix}{i % (count // 2 + 1)}", f"fn{i % 5}",
                             attempt=rng.randint(0, 2), start=rng.uniform(0, 3000),
                             run_s=rng.choice([None, rng.uniform(0, 90)]), end_state=end,
                             node=rng.choice(["nodeA", "nodeB"]), job=f"job{i % 3}",
                             error=error, pid=rng.randint(1, 999))
        exception_class = rng.choice(["ValueError", "KeyError", None])
        for piece in pieces:
            if i % 7 == 0:
                piece["attrs"] = {**(piece.get("attrs") or {}), "ray_session": "s2"}
            if i % 11 == 0:  # Ray's driver task: counted apart, as Ray counts
                piece["attrs"] = {**(piece.get("attrs") or {}), "ray_task_type": "DRIVER_TASK"}
            if piece.get("error_type") and exception_class:  # Ray's failure, class parsed
                piece["error_type"] = "TASK_EXECUTION_EXCEPTION"
                piece["attrs"] = {**(piece.get("attrs") or {}), "exception_class": exception_class}
            if rng.random() < 0.1:
                piece["received"] += 10**9  # a later copy of the same event
                rows.append(dict(piece, received=piece["received"] + 1))
        rows += pieces
    rows.append(event(kind="task", task_id=f"{prefix}-lone", state="RUNNING",
                      time=rows[0]["time"], node_id="nodeA", pid=7))
    rows.append(event(kind="op", name="forward", state="FINISHED", time=rows[0]["time"],
                      node_id="nodeA", span_id="s1"))
    rng.shuffle(rows)
    return rows


def write_in_files(root: Path, rows: list[Row], stem: str, files: int) -> None:
    for index in range(files):
        write_rows(local_put(root), rows[index::files], f"{stem}-{index:03d}.parquet")


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "lake"
    root.mkdir()
    write_in_files(root, random_attempts(random.Random(1), 120, "t"), "part", 6)
    return root, tmp_path / "cache"


def open_pair(root: Path, cache: Path) -> tuple[Store, Store]:
    cached = Store(StoreOptions(str(root), refresh_s=0.0, cache_dir=str(cache)))
    scratch = Store(StoreOptions(str(root), refresh_s=0.0, fold=False))
    return cached, scratch


def test_fold_matches_tasks_sql_then_new_files_then_compaction(stores: tuple[Path, Path]
                                                               ) -> None:
    root, cache = stores
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)
    # More pieces of the same tasks and new tasks arrive in new files.
    write_in_files(root, random_attempts(random.Random(2), 80, "t"), "late", 3)
    assert_same(cached, scratch)
    before = cached.fold.generation if cached.fold else 0
    report = run_compact(str(root), grace_s=0.0)
    assert report.merged_files and not report.errors
    assert_same(cached, scratch)
    assert cached.fold is not None and cached.fold.rebuilds == 0  # compaction is no loss
    assert cached.fold.adopted_files == report.written_files  # and nothing to read again
    assert cached.fold.generation > before
    cached.close()
    scratch.close()


def test_a_new_process_reuses_the_cache_and_folds_only_new_files(stores: tuple[Path, Path]
                                                                 ) -> None:
    root, cache = stores
    first = Store(StoreOptions(str(root), cache_dir=str(cache)))
    first.refresh()
    first.close()
    path = cache_file(str(cache), str(root.resolve()))
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM files").fetchone() == (
            len(list(root.rglob("*.parquet"))),)
    write_in_files(root, random_attempts(random.Random(3), 30, "n"), "new", 1)
    cached, scratch = open_pair(root, cache)
    assert cached.fold is not None and cached.fold.path == path
    with cached._lock:  # what the reopened fold still has to read
        known = {p for p, in cached._con.execute("SELECT path FROM fold.files").fetchall()}
    assert not any("new-000" in p for p in known)
    assert_same(cached, scratch)
    cached.close()
    scratch.close()


def test_a_long_first_fold_is_announced_once_on_stderr(
        stores: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, cache = stores
    monkeypatch.setattr(fold_module, "LONG_FOLD_BYTES", 1)  # every fold counts as long
    args = ("--data", str(root), "--cache", str(cache), "summary", "--json")
    code, out, err = in_process(capsys, *args)
    assert code == 0 and out
    files = len(list(root.rglob("*.parquet")))
    assert err.startswith(f"evagg query: folding {files} files (")
    assert "once: later queries fold only new files" in err
    code, out, err = in_process(capsys, *args)
    assert (code, err) == (0, "")  # nothing new to fold: nothing to say
    monkeypatch.setattr(fold_module, "LONG_FOLD_BYTES", 2**40)
    write_in_files(root, random_attempts(random.Random(4), 10, "q"), "quick", 1)
    code, out, err = in_process(capsys, *args)
    assert (code, err) == (0, "")  # a short fold says nothing


def test_refolding_the_same_rows_changes_nothing(stores: tuple[Path, Path]) -> None:
    root, cache = stores
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)
    # The same rows again under other names: a resent batch, or a copy before compaction.
    for path in sorted(root.rglob("part-000.parquet")):
        path.with_name("again.parquet").write_bytes(path.read_bytes())
    assert_same(cached, scratch)
    cached.close()
    scratch.close()


def test_deleted_files_rebuild_the_fold(stores: tuple[Path, Path]) -> None:
    root, cache = stores
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)
    for path in sorted(root.rglob("part-001.parquet")):  # retention, or a hand
        path.unlink()
    assert_same(cached, scratch)
    assert cached.fold is not None and cached.fold.rebuilds == 1
    cached.close()
    scratch.close()


def test_a_cache_held_by_other_processes_takes_the_next_slot_then_memory(
        stores: tuple[Path, Path]) -> None:
    root, cache = stores
    cache.mkdir()
    key = str(root.resolve())
    holders = [Store(StoreOptions(str(root), cache_dir=str(cache)))]
    try:
        second, scratch = open_pair(root, cache)
        assert second.fold is not None and second.fold.path == cache_file(str(cache), key, 1)
        assert_same(second, scratch)
        holders += [second, Store(StoreOptions(str(root), cache_dir=str(cache)))]
        last = Store(StoreOptions(str(root), refresh_s=0.0, cache_dir=str(cache)))
        assert last.fold is not None and last.fold.path is None  # every slot is held
        assert "folding in memory" in last.note
        assert_same(last, scratch)
        last.close()
        scratch.close()
    finally:
        for holder in holders:
            holder.close()


def test_a_cache_file_locked_by_another_process_is_left_alone(stores: tuple[Path, Path]
                                                               ) -> None:
    root, cache = stores
    built = evagg("query", "--data", str(root), "--cache", str(cache), "summary")
    assert built.returncode == 0, built.stderr
    held = cache_file(str(cache), str(root.resolve()))
    holder = subprocess.Popen(  # another process that writes the file: it holds the lock
        [sys.executable, "-c", "import duckdb, sys; con = duckdb.connect(sys.argv[1]); "
         "print('ready', flush=True); sys.stdin.read()", str(held)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        # Read once the holder has it: opening replays what the last fold left in the WAL.
        before = held.read_bytes()
        cached, scratch = open_pair(root, cache)
        assert cached.fold is not None
        assert cached.fold.path == cache_file(str(cache), str(root.resolve()), 1)
        assert_same(cached, scratch)
        cached.close()
        scratch.close()
        assert held.read_bytes() == before  # neither removed nor rewritten
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)


def test_a_damaged_cache_file_is_started_again(stores: tuple[Path, Path]) -> None:
    root, cache = stores
    cache.mkdir()
    cache_file(str(cache), str(root.resolve())).write_bytes(b"not a database" * 100)
    cached, scratch = open_pair(root, cache)
    assert cached.fold is not None and cached.fold.path is not None
    assert_same(cached, scratch)
    cached.close()
    scratch.close()


def test_an_unwritable_cache_folder_falls_back_to_memory(stores: tuple[Path, Path]) -> None:
    root, cache = stores
    cache.write_text("a file where the cache folder should be")
    cached, scratch = open_pair(root, cache / "sub")
    assert cached.fold is not None and cached.fold.path is None
    assert "folding in memory" in cached.note
    assert_same(cached, scratch)
    cached.close()
    scratch.close()


def test_read_only_data_folder_with_a_writable_cache(stores: tuple[Path, Path]) -> None:
    root, cache = stores
    files = list(root.rglob("*.parquet"))
    for path in files:
        path.chmod(stat.S_IRUSR)
    cached, scratch = open_pair(root, cache)
    assert cached.fold is not None and cached.fold.path is not None
    assert_same(cached, scratch)
    assert not [p for p in root.rglob("*") if p.is_file() and p not in files]  # wrote nothing
    cached.close()
    scratch.close()


def test_the_pyarrow_engine_folds_the_same(stores: tuple[Path, Path]) -> None:
    root, cache = stores
    arrow = Store(StoreOptions(str(root), engine="pyarrow", refresh_s=0.0, cache_dir=str(cache)))
    scratch = Store(StoreOptions(str(root), refresh_s=0.0, fold=False))
    assert_same(arrow, scratch)
    run_compact(str(root), grace_s=0.0)
    assert_same(arrow, scratch)
    assert arrow.fold is not None and arrow.fold.rebuilds == 0
    arrow.close()
    scratch.close()


def test_late_pieces_of_old_tasks_and_old_copies_fold_exactly(stores: tuple[Path, Path]
                                                              ) -> None:
    """The merge finds touched rows by rowid (old ones sit mid-table, not at its end) and
    `seen` is searched within the batch's time span: copies of old events, resent in a
    new file with their own times, still count once."""
    root, cache = stores
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)
    old = sorted(root.rglob("part-000.parquet"))
    copies = [row for path in old for row in duckdb.execute(
        "SELECT * REPLACE (epoch_ns(time) AS time, epoch_ns(received) AS received) "
        "FROM read_parquet($p, hive_partitioning = false)", {"p": str(path)}
    ).to_arrow_table().to_pylist()]
    write_in_files(root, random_attempts(random.Random(4), 200, "m"), "middle", 2)
    assert_same(cached, scratch)  # now the first tasks' rows are far from the end
    rng = random.Random(5)
    late: list[Row] = [dict(row, received=row["received"] + 7 * 10**9) for row in copies[::3]]
    for i in range(0, 60, 4):  # more pieces of early tasks, some finishing before running
        late += task_events(f"t{i}", f"fn{i % 5}", attempt=0, start=rng.uniform(0, 3000),
                            run_s=rng.uniform(-30, 3000), end_state="FINISHED")
    write_in_files(root, late, "resent", 1)
    assert_same(cached, scratch)
    assert cached.fold is not None and cached.fold.rebuilds == 0
    cached.close()
    scratch.close()


def wal_bytes(path: Path) -> int:
    wal = Path(f"{path}.wal")
    return wal.stat().st_size if wal.exists() else 0


def test_a_fold_leaves_its_wal_and_a_process_at_rest_checkpoints_it(
        stores: tuple[Path, Path]) -> None:
    """Closing after a fold skips the checkpoint (the next open replays the WAL); a
    process that folds nothing checkpoints what it replayed, so queries at rest don't
    replay it again. Answers are the same across both."""
    root, cache = stores
    first = Store(StoreOptions(str(root), cache_dir=str(cache)))
    first.refresh()
    first.close()
    path = cache_file(str(cache), str(root.resolve()))
    write_in_files(root, random_attempts(random.Random(6), 40, "w"), "wal", 1)
    folding = Store(StoreOptions(str(root), cache_dir=str(cache)))
    queries.summary(folding)
    assert folding.fold is not None and folding.fold.folded_files > 0
    folding.close()
    assert wal_bytes(path) > 0  # the fold's commit, not yet in the file
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)  # replayed from the WAL
    assert cached.fold is not None and cached.fold.folded_files == 0
    cached.close()
    scratch.close()
    assert wal_bytes(path) == 0
    again, scratch = open_pair(root, cache)
    assert_same(again, scratch)
    again.close()
    scratch.close()


def test_a_first_build_in_several_batches_after_events_without_tasks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first batch holds no task events (task_fold stays empty, `seen` does not), the
    next appends into the empty table, the rest merge: all as tasks.sql."""
    root = tmp_path / "lake"
    root.mkdir()
    ops = [event(kind="op", name=f"op{i}", state="FINISHED", time=1_700_000_000 + i,
                 node_id="nodeA", span_id=f"s{i}") for i in range(20)]
    write_rows(local_put(root), ops, "a-ops.parquet")
    write_in_files(root, random_attempts(random.Random(7), 90, "b"), "b-part", 4)
    monkeypatch.setattr(fold_files, "BATCH_FILES", 1)  # one file per transaction
    cached, scratch = open_pair(root, tmp_path / "cache")
    assert_same(cached, scratch)
    listing = cached.refresh()
    assert listing.files[0].path.endswith("a-ops.parquet")  # folded first, alone
    assert cached.fold is not None and cached.fold.folded_files == len(listing.files) > 2
    cached.close()
    scratch.close()


def test_tasks_without_durations_summarise_as_tasks_sql(tmp_path: Path) -> None:
    """No task has a duration: no bin holds a quantile's rank, the summary reads no rows."""
    root = tmp_path / "lake"
    root.mkdir()
    rows = [event(kind="task", task_id=f"u{i}", name="fn", state="RUNNING",
                  time=1_700_000_000 + i, node_id="nodeA") for i in range(5)]
    write_rows(local_put(root), rows, "running.parquet")
    cached, scratch = open_pair(root, tmp_path / "cache")
    assert_same(cached, scratch)
    cached.close()
    scratch.close()


def test_a_small_fold_runs_on_one_thread_and_restores_the_setting(
        stores: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache = stores
    during: list[object] = []
    fold_rows = fold_module.TaskFold._fold_rows

    def spy(self: fold_module.TaskFold, cur: duckdb.DuckDBPyConnection, batch: Listing
            ) -> None:
        during.append(cur.execute("SELECT current_setting('threads')").fetchone())
        fold_rows(self, cur, batch)

    monkeypatch.setattr(fold_module.TaskFold, "_fold_rows", spy)
    cached, scratch = open_pair(root, cache)
    cached._con.execute("SET threads = 3")
    assert_same(cached, scratch)
    assert during == [(1,)]
    assert cached._con.execute("SELECT current_setting('threads')").fetchone() == (3,)
    cached.close()
    scratch.close()


def test_a_failed_checkpoint_on_close_is_logged_and_the_store_still_closes(
        stores: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    root, cache = stores
    cached = Store(StoreOptions(str(root), cache_dir=str(cache)))
    cached.refresh()

    def fail(self: fold_module.TaskFold, con: duckdb.DuckDBPyConnection) -> None:
        raise duckdb.IOException("disk full")

    monkeypatch.setattr(fold_module.TaskFold, "close", fail)
    cached.close()
    assert "task cache checkpoint failed: disk full" in caplog.text
    with pytest.raises(duckdb.ConnectionException):
        cached._con.execute("SELECT 1")
    reopened, scratch = open_pair(root, cache)  # the WAL replays: nothing lost
    assert_same(reopened, scratch)
    reopened.close()
    scratch.close()


class SectionSpy(dict[str, str]):
    """fold.sql's sections, recording which ones the fold runs."""

    def __init__(self, sections: dict[str, str]) -> None:
        super().__init__(sections)
        self.ran: list[str] = []

    def __getitem__(self, key: str) -> str:
        self.ran.append(key)
        return super().__getitem__(key)


def spy_sections(store: Store) -> SectionSpy:
    assert store.fold is not None
    spy = SectionSpy(store.fold.sql)
    store.fold.sql = spy
    return spy


def test_a_file_of_new_tasks_goes_in_as_it_is_and_one_touching_stored_tasks_merges(
        stores: tuple[Path, Path]) -> None:
    """A batch whose tasks are all new skips the merge (@fresh); a batch with pieces of
    stored tasks and new tasks merges the stored ones and passes the new ones: both as
    tasks.sql, summary counts included."""
    root, cache = stores
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)
    spy = spy_sections(cached)
    write_in_files(root, random_attempts(random.Random(8), 40, "fresh"), "fresh", 1)
    assert_same(cached, scratch)
    assert "fresh" in spy.ran and "merge" not in spy.ran
    spy.ran.clear()
    rng = random.Random(9)
    mixed: list[Row] = []
    for i in range(0, 40, 3):  # the end of stored attempts (new bins), and new attempts
        mixed += task_events(f"t{i}", f"fn{i % 5}", attempt=0, start=rng.uniform(0, 3000),
                             run_s=rng.uniform(0, 90), end_state="FAILED",
                             error=("KeyError", "late", "Traceback"))
        mixed += task_events(f"mixed{i}", "fn1", start=rng.uniform(0, 3000),
                             run_s=rng.uniform(0, 90), end_state="FINISHED")
    write_in_files(root, mixed, "mixed", 1)
    assert_same(cached, scratch)
    assert "merge" in spy.ran and "fresh" not in spy.ran
    cached.close()
    scratch.close()


def test_scans_of_stored_tables_run_on_every_thread_in_a_small_fold(
        stores: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A small batch folds on one thread, but the statements that scan a whole stored
    table (the id check against `seen`, finding touched rows by k) get the database's
    threads back for themselves; the setting is restored after."""
    root, cache = stores
    cached, scratch = open_pair(root, cache)
    assert_same(cached, scratch)
    cached._con.execute("SET threads = 3")
    during: list[tuple[str, object]] = []  # (the section run last, threads inside)
    spy = spy_sections(cached)
    threads = fold_module.threads

    @contextmanager
    def watch(cur: duckdb.DuckDBPyConnection, wanted: int) -> Iterator[int]:
        with threads(cur, wanted) as before:
            during.append((spy.ran[-1], cur.execute(
                "SELECT current_setting('threads')").fetchone()))
            yield before

    monkeypatch.setattr(fold_module, "threads", watch)
    write_in_files(root, random_attempts(random.Random(10), 30, "t"), "threads", 1)
    assert_same(cached, scratch)
    # the batch on one thread; then the check against `seen` (after @ids) and the
    # search for touched rows (after @merge_batch) on three
    assert [t for _, t in during] == [(1,), (3,), (3,)]
    assert [s for s, _ in during[1:]] == ["ids", "merge_batch"]
    assert cached._con.execute("SELECT current_setting('threads')").fetchone() == (3,)
    cached.close()
    scratch.close()


def test_the_definitions_name_wins_over_a_later_event_without_a_state(tmp_path: Path) -> None:
    """A NULL state must rank below DEFINED for the name, in tasks.sql and in the fold:
    DuckDB orders a NULL struct field after every value."""
    root = tmp_path / "lake"
    root.mkdir()
    rows = [event(kind="task", task_id="d1", name="defined_name", state="DEFINED",
                  time=at(10)),
            event(kind="task", task_id="d1", name="stateless_name", time=at(20)),
            event(kind="task", task_id="d1", state="FINISHED", time=at(30)),
            event(kind="task", task_id="d2", name="first", state="RUNNING", time=at(10)),
            event(kind="task", task_id="d2", name="latest", time=at(20))]
    write_rows(local_put(root), rows, "names.parquet")
    cached, scratch = open_pair(root, tmp_path / "cache")
    for store in (cached, scratch):
        names = store.execute("SELECT task_id, name FROM tasks ORDER BY task_id").rows
        assert names == [["d1", "defined_name"], ["d2", "latest"]]
    assert_same(cached, scratch)
    cached.close()
    scratch.close()
