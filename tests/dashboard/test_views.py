"""The DuckDB views over a generated store with known answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dashboard.lake.errors import NoData, NotFound
from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.lakegen import (
    Expected,
    at,
    event,
    local_put,
    table_of,
    task_events,
    write_rows,
)

TASK_COLUMNS = {"task_id", "attempt", "pending_at", "submitted_at", "running_at", "finished_at",
                "failed_at", "final_state", "duration_s", "name", "job_id", "node_id", "worker_id",
                "error_type", "error_message", "stack_trace", "source"}


def one(store: Store, sql: str) -> object:
    return store.execute(sql).rows[0][0]


def test_events_counts_each_event_once_across_files(store: Store, expected: type[Expected]) -> None:
    assert one(store, "SELECT count(*) FROM events_raw") == expected.raw_rows
    assert one(store, "SELECT count(*) FROM events") == expected.distinct_events
    assert one(store, "SELECT count(DISTINCT event_id) FROM events") == expected.distinct_events


def test_events_carry_hive_partition_columns(store: Store) -> None:
    rows = store.execute("SELECT DISTINCT date, hour, node FROM events ORDER BY ALL").records()
    assert {"date": "2025-03-01", "hour": 10, "node": "nodeA"} in rows
    assert {r["node"] for r in rows} == {"nodeA", "nodeB", "unknown"}


def test_tasks_view_has_the_agreed_columns(store: Store) -> None:
    assert set(store.columns("tasks")) >= TASK_COLUMNS


def test_split_out_of_order_task_events_fold_into_one_row(store: Store) -> None:
    # sq03's terminal event is in the first file, RUNNING in the second, the definition
    # (the only piece with the name) in the third.
    row = store.execute("SELECT * FROM tasks WHERE task_id = 'sq03'").records()
    assert len(row) == 1
    task = row[0]
    assert task["name"] == "square"
    assert task["final_state"] == "FINISHED"
    assert task["worker_id"] == "w-sq03"
    assert task["node_id"] == "nodeA"
    assert task["pending_at"] == "2025-03-01T10:00:30.000000Z"
    assert task["running_at"] == "2025-03-01T10:00:30.200000Z"
    assert task["finished_at"] == "2025-03-01T10:00:33.200000Z"
    assert task["failed_at"] is None
    assert task["duration_s"] == pytest.approx(3.0)


def test_attempts_are_separate_rows_and_unfinished_tasks_keep_their_state(store: Store) -> None:
    flaky = store.execute("SELECT attempt, final_state, error_type FROM tasks "
                          "WHERE task_id = 'flaky' ORDER BY attempt").rows
    assert flaky == [[0, "FAILED", "OSError"], [1, "FINISHED", None]]
    states = dict(store.execute("SELECT task_id, final_state FROM tasks "
                                "WHERE task_id IN ('slow1', 'wait1')").rows)
    assert states == {"slow1": "RUNNING", "wait1": "SUBMITTED"}


def test_counts_by_state_and_error(store: Store, expected: type[Expected]) -> None:
    assert one(store, "SELECT count(*) FROM tasks") == expected.tasks
    by_state = dict(store.execute("SELECT value, tasks FROM summary_by_state").rows)
    assert by_state == expected.by_state
    by_error = dict(store.execute("SELECT value, failed FROM summary_by_error").rows)
    assert by_error == expected.errors


def test_duration_quantiles(store: Store, expected: type[Expected]) -> None:
    row = store.execute("SELECT p50_s, p90_s, p99_s, max_s FROM summary_by_name "
                        "WHERE value = 'square'").rows[0]
    assert row == pytest.approx(list(expected.square_quantiles))
    bins = store.execute("SELECT duration_bins FROM summary_by_name WHERE value = 'square'").rows
    assert sum(bins[0][0].values()) == 10  # every finished square task is in a bin


def test_task_summary_has_every_dimension_in_one_pass(store: Store,
                                                      expected: type[Expected]) -> None:
    rows = store.execute("SELECT dimension, value, tasks, failed, p50_s FROM task_summary").rows
    dims = {r[0] for r in rows}
    assert dims == {"all", "state", "name", "error_type", "job", "node"}
    total = next(r for r in rows if r[0] == "all")
    assert total[2] == expected.tasks and total[3] == 4
    assert ["name", "square", 10, 0, pytest.approx(5.5)] in rows
    assert not [r for r in rows if r[0] == "error_type" and r[1] is None]


def test_step_grouping_rule(store: Store, expected: type[Expected]) -> None:
    steps = store.execute("SELECT step, ops, failures, op_names FROM steps "
                          "WHERE run_id = 'run1' ORDER BY step").records()
    assert {s["step"]: s["ops"] for s in steps} == expected.steps
    assert {s["step"]: s["failures"] for s in steps} == expected.step_failures
    # the load before step 0 joins step 0; eval (step 3) and the final save (no step)
    # come after the last optimizer step (2) and join it instead of making a step
    assert "load_checkpoint" in steps[0]["op_names"]
    assert {"eval", "save"} <= set(steps[2]["op_names"])
    assert one(store, "SELECT count(*) FROM steps WHERE step = 3 OR step IS NULL") == 0


def test_step_metric_spread_and_seconds(store: Store, expected: type[Expected]) -> None:
    row = store.execute("SELECT seconds, metrics FROM steps WHERE run_id = 'run1' AND step = 1"
                        ).records()[0]
    loss = row["metrics"]["loss"]
    assert (loss["min"], loss["max"], loss["mean"]) == pytest.approx(expected.step1_loss)
    assert row["seconds"] == pytest.approx(0.5 + 0.5 + 1.0 + 0.25)
    metrics = store.execute("SELECT metric, n FROM step_metrics WHERE run_id = 'run1' "
                            "AND step = 2 ORDER BY metric").rows
    assert metrics == [["grad_norm", 1], ["loss", 2]]  # the forward's loss and eval's loss


def test_runs_without_optimizer_ops_and_without_run_id(tmp_path: Path) -> None:
    from tests.dashboard.lakegen import op

    rows = op("fwd", 0, 0, 1) + op("fwd", 1, 5, 1) + op("tail", None, 10, 1)
    rows += op("orphan", None, 20, 2, run="")
    for row in rows[-2:]:
        row["run_id"] = None
    write_rows(local_put(tmp_path), rows, "part-1.parquet")
    with_store = Store(StoreOptions(str(tmp_path)))
    steps = with_store.execute("SELECT run_id, step, ops FROM steps ORDER BY ALL").rows
    assert steps == [["", None, 1], ["run1", 0, 1], ["run1", 1, 2]]


def test_an_op_that_encloses_the_steps_counts_in_none_of_them(tmp_path: Path) -> None:
    """The method that runs the loop, traced as one op (@traced_remote on a Ray actor's
    train()), had joined the last step: 45 ms against 0.6 ms for the others, and a run
    whose steps' seconds summed past its own span."""
    from tests.dashboard.lakegen import op

    rows = op("Trainer.train", None, 0, 50)  # encloses every step
    for step in range(4):
        rows += op("train_step", step, 10 + 10 * step, 1)
    rows += op("save", None, 45, 2)  # after the last step began: in the last step
    rows += op("prefetch", None, 19.5, 1)  # across one boundary: in the step it began in
    write_rows(local_put(tmp_path), rows, "part-1.parquet")
    store = Store(StoreOptions(str(tmp_path)))
    grouped = dict(store.execute("SELECT name, step_group FROM op_steps WHERE step IS NULL"
                                 ).rows)
    assert grouped == {"save": 3, "prefetch": 0}  # Trainer.train in no step
    steps = store.execute("SELECT step, ops, seconds FROM steps ORDER BY step").rows
    assert [(step, ops) for step, ops, _ in steps] == [(0, 2), (1, 1), (2, 1), (3, 2)]
    assert steps[3][2] == pytest.approx(3.0)  # its own second and the save's two
    assert store.execute("SELECT seconds FROM runs").rows == [[pytest.approx(7.0)]]


def test_spans_and_traces(store: Store, expected: type[Expected]) -> None:
    spans = store.execute("SELECT name, parent_span_id, duration_s, state FROM spans "
                          "ORDER BY start_at").rows
    assert len(spans) == expected.spans
    assert spans[0][:2] == ["request", None]
    assert spans[3] == ["template", "a000000000000003", pytest.approx(0.1), "FAILED"]
    trace = store.execute("SELECT root_name, spans, failures, duration_s, services FROM traces"
                          ).rows
    assert trace == [["request", 4, 1, pytest.approx(1.0), ["api"]]]


def test_agents_and_losses(store: Store, expected: type[Expected]) -> None:
    agents = {r["node_id"]: r for r in store.execute("SELECT * FROM agents").records()}
    node_a = agents["nodeA"]
    assert node_a["heartbeats"] == 3  # the duplicated heartbeat counts once
    assert node_a["received_total"] == pytest.approx(400)
    assert node_a["received_per_s"] == pytest.approx(expected.agents_received_per_s)
    assert node_a["lost_events"] == pytest.approx(expected.lost_events_node_a)
    assert node_a["dropped_total"] == 0  # the sample's heartbeats have no dropped counter
    assert node_a["last_seen"] == "2025-03-01T10:00:20.000000Z"
    assert agents["nodeB"]["received_per_s"] is None  # one heartbeat: no rate yet
    assert one(store, "SELECT sum(events) FROM losses") == pytest.approx(8)


def test_agent_totals_are_zero_without_their_counters(tmp_path: Path) -> None:
    # A labelled counter appears only once something was counted: a heartbeat without
    # the dropped counter (or without metrics at all) has dropped nothing.
    def beat(node: str, t: float, metrics: dict[str, float] | None) -> dict[str, object]:
        return event(kind="agent", source="evagg", name="heartbeat", state="RUNNING",
                     node_id=node, time=at(t), metrics=metrics)

    counted = {'evagg_received_events_total{route="socket"}': 10.0,
               'evagg_dropped_events_total{reason="spool_full"}': 2.0,
               'evagg_dropped_events_total{reason="queue_full"}': 3.0}
    write_rows(local_put(tmp_path), [
        beat("quiet", 0, {'evagg_received_events_total{route="socket"}': 7.0}),
        beat("bare", 0, None),
        beat("dropping", 0, counted),
    ], "part-1.parquet")
    with_store = Store(StoreOptions(str(tmp_path)))
    rows = with_store.execute("SELECT node_id, received_total, delivered_total, dropped_total "
                              "FROM agents ORDER BY node_id").rows
    assert rows == [["bare", 0, 0, 0], ["dropping", 10, 0, 5], ["quiet", 7, 0, 0]]
    with_store.close()


def test_a_restart_is_a_new_agent_process_and_a_clean_stop_is_no_gap(tmp_path: Path) -> None:
    """An agent stopped (its final beat says STOPPING) and started again a minute later,
    having received as much as before: the new process is a restart though no counter
    fell, and the minute between is not a missed heartbeat. One that vanished without a
    final beat leaves a gap that is."""
    def beat(node: str, t: float, received: float, started: str,
             state: str = "RUNNING") -> dict[str, object]:
        return event(kind="agent", source="evagg", name="heartbeat", state=state,
                     node_id=node, time=at(t), attrs={"heartbeat_interval_s": "10",
                                                      "started_at": started},
                     metrics={'evagg_received_events_total{route="socket"}': received})

    write_rows(local_put(tmp_path), [
        beat("stopped", 0, 100, "a"), beat("stopped", 10, 200, "a", "STOPPING"),
        beat("stopped", 70, 200, "b"), beat("stopped", 80, 300, "b"),
        beat("lost", 0, 100, "a"), beat("lost", 70, 200, "b"), beat("lost", 80, 300, "b"),
        beat("steady", 0, 100, "a"), beat("steady", 10, 200, "a"),
    ], "part-1.parquet")
    with_store = Store(StoreOptions(str(tmp_path)))
    rows = with_store.execute(
        "SELECT node_id, restarts, restarted_at, longest_gap_s, missed_gaps, received_per_s "
        "FROM agents ORDER BY node_id").rows
    assert rows == [["lost", 1, "2025-03-01T10:01:10.000000Z", pytest.approx(70), 1, 10.0],
                    ["steady", 0, None, pytest.approx(10), 0, 10.0],
                    ["stopped", 1, "2025-03-01T10:01:10.000000Z", pytest.approx(10), 0, 10.0]]
    with_store.close()


def test_duplicate_op_counts_once_in_steps(store: Store) -> None:
    assert one(store, "SELECT count(*) FROM ops WHERE run_id = 'run1'") == 13
    assert one(store, "SELECT sum(ops) FROM steps WHERE run_id = 'run1'") == 13


def test_new_files_appear_and_compaction_keeps_answers(lake: Path, store: Store) -> None:
    before = store.execute("SELECT * FROM task_summary ORDER BY ALL").rows
    partitions = sorted({p.parent for p in lake.rglob("*.parquet")})
    for partition in partitions:  # compact: one file per partition, originals removed
        files = sorted(partition.glob("*.parquet"))
        merged = pa.concat_tables([pq.read_table(f) for f in files])
        for f in files:
            f.unlink()
        pq.write_table(merged, partition / "compacted-0.parquet")
    assert store.execute("SELECT * FROM task_summary ORDER BY ALL").rows == before
    extra = task_events("late1", "late", start=50.0, run_s=1.0, end_state="FINISHED")
    write_rows(local_put(lake), extra, "part-00009.parquet")
    assert one(store, "SELECT count(*) FROM tasks") == Expected.tasks + 1


def test_pyarrow_engine_gives_the_same_answers(lake: Path, store: Store) -> None:
    other = Store(StoreOptions(str(lake), engine="pyarrow"))
    assert other.engine == "pyarrow"
    for sql in ("SELECT * FROM task_summary ORDER BY ALL",
                "SELECT run_id, step, ops, seconds FROM steps ORDER BY ALL",
                "SELECT count(*) FROM events"):
        assert other.execute(sql).rows == store.execute(sql).rows
    other.close()


def test_old_files_with_fewer_columns_still_read(tmp_path: Path) -> None:
    rows = task_events("t1", "f", start=0, run_s=1.0, end_state="FINISHED")
    table = table_of(rows).drop_columns(["metrics", "nonfinite", "stack_trace"])
    folder = tmp_path / "date=2025-03-01/hour=10/node=nodeA"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "old.parquet")
    write_rows(local_put(tmp_path), [event(kind="task", task_id="t2", state="RUNNING",
                                           time=at(5), node_id="nodeA")], "new.parquet")
    mixed = Store(StoreOptions(str(tmp_path)))
    assert mixed.execute("SELECT task_id, final_state FROM tasks ORDER BY 1").rows == [
        ["t1", "FINISHED"], ["t2", "RUNNING"]]


def test_a_newer_file_with_more_columns_reaches_every_view(tmp_path: Path) -> None:
    """A new file of the same columns only points the views at the new listing; one that
    brings a column the older files lack binds them all again, as a first open would."""
    folder = tmp_path / "date=2025-03-01/hour=10/node=nodeA"
    folder.mkdir(parents=True)

    def write_without_uid(task_id: str, start: float) -> None:  # as files before `uid`
        rows = task_events(task_id, "f", start=start, run_s=1.0, end_state="FINISHED")
        pq.write_table(table_of(rows).drop_columns(["uid"]), folder / f"{task_id}.parquet")

    write_without_uid("t0", 0.0)
    store = Store(StoreOptions(str(tmp_path), refresh_s=0.0))
    assert "uid" not in store.columns("events")
    write_without_uid("t2", 2.0)
    assert store.execute("SELECT task_id, final_state FROM tasks ORDER BY 1").rows == [
        ["t0", "FINISHED"], ["t2", "FINISHED"]]
    newer = task_events("t4", "f", start=4, run_s=1.0, end_state="FAILED")
    write_rows(local_put(tmp_path), [{**row, "uid": 1000} for row in newer], "new.parquet")
    assert "uid" in store.columns("events")
    assert store.execute("SELECT task_id, count(uid) FROM events GROUP BY 1 ORDER BY 1"
                         ).rows == [["t0", 0], ["t2", 0], ["t4", len(newer)]]
    assert one(store, "SELECT count(*) FROM tasks WHERE final_state = 'FAILED'") == 1
    store.close()


def test_files_outside_the_hive_layout(tmp_path: Path) -> None:
    rows = task_events("t1", "f", start=0, run_s=1.0, end_state="FINISHED")
    pq.write_table(table_of(rows), tmp_path / "loose.parquet")
    flat = Store(StoreOptions(str(tmp_path)))
    assert flat.execute("SELECT count(*), count(date) FROM events").rows == [[len(rows), 0]]
    write_rows(local_put(tmp_path), rows, "part.parquet")  # now Hive files exist: loose ignored
    flat.refresh(force=True)
    assert flat.describe()["ignored_files"] == 1
    assert one(flat, "SELECT count(*) FROM events") == len(rows)


def test_empty_and_missing_directories(tmp_path: Path) -> None:
    empty = Store(StoreOptions(str(tmp_path)))
    with pytest.raises(NoData, match="no Parquet files under"):
        empty.execute("SELECT 1")
    with pytest.raises(NotFound, match="does not exist"):
        Store(StoreOptions(str(tmp_path / "missing")))
    gone = tmp_path / "gone"
    gone.mkdir()
    later = Store(StoreOptions(str(gone)))
    shutil.rmtree(gone)
    with pytest.raises(NotFound, match="does not exist"):
        later.refresh(force=True)


def test_files_removed_between_listings_are_relisted(lake: Path) -> None:
    slow = Store(StoreOptions(str(lake), refresh_s=3600.0))  # would not relist on its own
    before = slow.execute("SELECT count(*) FROM events").rows
    partitions = sorted({p.parent for p in lake.rglob("*.parquet")})
    for partition in partitions:
        files = sorted(partition.glob("*.parquet"))
        merged = pa.concat_tables([pq.read_table(f) for f in files])
        pq.write_table(merged, partition / "compacted-1.parquet")
        for f in files:
            f.unlink()
    assert slow.execute("SELECT count(*) FROM events").rows == before  # relisted once
    assert slow.describe()["files"] == len(partitions)
    slow.close()


def test_user_sql_statement_without_rows(store: Store) -> None:
    result = store.execute("CREATE TEMP VIEW mine AS SELECT 1 AS x", user_sql=True)
    assert result.rows == []


def test_a_job_key_splits_back_into_its_job_and_session() -> None:
    # keys.sql's job_key names a Ray job for the summaries; the timeline and the logs read
    # the name back with split_job_key: the two hold each other
    import duckdb

    from dashboard.lake.fold_sql import read_sql
    from dashboard.raystate.sessions import split_job_key

    con = duckdb.connect()
    con.execute(read_sql("keys.sql"))
    for job, session in [("01000000", "session_2026-12-06_10-00-00_000001_1"),
                         ("my@job", "session_x"), ("job1", None), ("job1", "")]:
        (key,) = con.execute("SELECT job_key($j, $s)", {"j": job, "s": session}).fetchone()
        assert split_job_key(key) == (job, session or None), key
