"""`evagg query timeline` over a store whose Ray tasks came without profile events (Ray
exports those only with EXPOSABLE_EVENT_TYPES=ALL): one slice per attempt from its task
events, on numbered node and worker tracks, and errors a user can act on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dashboard.cli.query import add_query_parser, run_query
from tests.dashboard.raygen import JOB, SESSION, write_ray_lake

TASKS = 400


@pytest.fixture
def ray_lake(tmp_path: Path) -> Path:
    return write_ray_lake(tmp_path / "lake", TASKS, span_s=60)


def timeline(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="evagg")
    add_query_parser(parser.add_subparsers())
    code = run_query(parser.parse_args(["query", "--no-cache", "timeline", *args]))
    out, err = capsys.readouterr()
    return code, out, err


def test_each_attempt_is_a_slice_on_its_worker_s_track(
        ray_lake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    code, shown, err = timeline(capsys, "--data", str(ray_lake), "--job", JOB,
                                "--out", str(out))
    assert code == 0, err
    assert SESSION in shown and str(TASKS) in shown  # what was written, as a table
    trace = json.loads(out.read_text())
    slices = [e for e in trace if e["ph"] == "X"]
    assert len(slices) == TASKS == len({e["args"]["task_id"] for e in slices})
    assert all(e["cat"] == f"task::{e['args']['func_or_class_name']}" for e in slices)
    assert all(e["args"]["evagg_from"] == "task_events" and e["dur"] > 0 for e in slices)
    assert {e["name"] for e in slices} <= {f"bench.fn_{i:02d}" for i in range(20)}
    processes = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
               if e["name"] == "thread_name"}
    assert sorted(processes.values()) == [f"Node 10.0.0.{i}" for i in range(1, 9)]
    assert all(name.startswith("worker:") for name in threads.values())
    assert {(e["pid"], e["tid"]) for e in slices} <= set(threads)


def test_attempts_that_never_ran_are_counted_as_not_drawn(
        ray_lake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An attempt whose worker died before its RUNNING went out has no slice: the command
    says how many, where `tasks` alone read as if some were lost."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    (part,) = ray_lake.glob("date=*/hour=*/node=*/tasks-*.parquet")
    table = pq.read_table(part)
    first = table.column("task_id")[0]
    ran = pc.and_(pc.equal(table.column("task_id"), first),
                  pc.is_in(table.column("state"), pa.array(["RUNNING", "FINISHED", "FAILED"])))
    pq.write_table(table.filter(pc.invert(ran)), part)
    code, shown, err = timeline(capsys, "--data", str(ray_lake), "--job", JOB,
                                "--out", str(tmp_path / "trace.json"), "--json")
    assert code == 0, err
    (written,) = json.loads(shown)
    assert (written["tasks"], written["attempts_not_drawn"]) == (TASKS - 1, 1), written


def test_a_session_or_file_that_cannot_be_used_is_said_so(
        ray_lake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = timeline(capsys, "--data", str(ray_lake), "--session", "session_1999",
                            "--out", str(tmp_path / "t.json"))
    assert code == 1 and "no Ray session 'session_1999'" in err and SESSION in err
    code, _, err = timeline(capsys, "--data", str(ray_lake),
                            "--out", str(tmp_path / "missing" / "t.json"))
    assert code == 2 and "cannot write" in err


def test_a_job_as_the_summary_names_it_and_a_job_with_no_tasks(
        ray_lake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    code, _, err = timeline(capsys, "--data", str(ray_lake), "--job", f"{JOB}@{SESSION}",
                            "--out", str(out))
    assert code == 0, err
    assert len([e for e in json.loads(out.read_text()) if e["ph"] == "X"]) == TASKS
    # a job that has no tasks there writes nothing and says so (exit 1), not an empty []
    missing = tmp_path / "none.json"
    code, _, err = timeline(capsys, "--data", str(ray_lake), "--job", "99999999",
                            "--out", str(missing))
    assert code == 1 and "no Ray tasks of job 99999999 in session" in err, err
    assert not missing.exists()
    code, _, err = timeline(capsys, "--data", str(ray_lake), "--job", f"{JOB}@{SESSION}",
                            "--session", "session_1999", "--out", str(missing))
    assert code == 2 and f"names session {SESSION}, not session_1999" in err, err


def test_an_actor_creation_task_shares_the_lane_of_the_worker_with_its_pid() -> None:
    """Ray's events name no worker for an actor's creation task, only its pid: it goes on
    the lane of the worker with that pid on its node, not a second lane of the same pid."""
    from dashboard.raystate.timeline import _lane_key, _workers_by_pid

    method = {"node_id": "n1", "worker_id": "w1", "pid": 22112}
    creation = {"node_id": "n1", "worker_id": None, "pid": 22112}
    elsewhere = {"node_id": "n2", "worker_id": None, "pid": 22112}  # another node's pid
    workers = _workers_by_pid([method, creation, elsewhere])
    assert _lane_key(creation, workers) == _lane_key(method, workers) == ("n1", "w1")
    assert _lane_key(elsewhere, workers) == ("n2", "")
