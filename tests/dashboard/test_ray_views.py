"""Ray's odd exports in the tasks view, the fold and the summary (docs/event-schema.md,
"Tasks"): an attempt Ray sends without its definition (an actor's restarted creation
task sends only RUNNING) is named after another attempt, else after the actor's repr;
a lifecycle event with no state transition makes no task row of its own.

The rows come from Ray-shaped payloads through the agent's own Ray mapping
(aggregator/ray/events.py), written as the Parquet sink lays them out.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from aggregator.ray.events import ray_events_to_rows
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions import queries
from tests.dashboard.fold_checks import assert_same_figures
from tests.dashboard.lakegen import local_put, write_rows
from tests.dashboard.rayshaped import S, b64, definition, envelope, lifecycle

BASE = 1_764_000_000 * S
ACTOR_INIT = b64("actor-init", 24)
NO_DEFINITION = b64("no-definition", 24)
STATELESS_ONLY = b64("stateless-only", 24)
STATELESS_THEN_RUNNING = b64("stateless-then-running", 24)


def without_transitions(task: str, at: int, **body: Any) -> dict[str, Any]:
    """A lifecycle event carrying no state transition (Ray sends these with a pid or
    log info before the first transition)."""
    payload = {"taskId": task, "jobId": "AQAAAA==", "taskAttempt": 0, "stateTransitions": [],
               **body}
    return envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", payload, "s1", at)


def ray_rows() -> list[dict[str, Any]]:
    repr_only = lifecycle(NO_DEFINITION, ("RUNNING", BASE + 3 * S), session="s1")
    repr_only["taskLifecycleEvent"]["actorReprName"] = "Counter(7)"
    items = [
        definition(ACTOR_INIT, "Counter.__init__", BASE, session="s1"),
        lifecycle(ACTOR_INIT, ("RUNNING", BASE + 1 * S), ("FAILED", BASE + 2 * S),
                  session="s1"),
        # the actor restarts: Ray exports the new attempt's RUNNING, no definition
        lifecycle(ACTOR_INIT, ("RUNNING", BASE + 4 * S), session="s1", attempt=1),
        repr_only,
        without_transitions(STATELESS_ONLY, BASE + 5 * S, workerPid=41),
        without_transitions(STATELESS_THEN_RUNNING, BASE + 6 * S, workerPid=42),
        lifecycle(STATELESS_THEN_RUNNING, ("RUNNING", BASE + 7 * S), session="s1"),
    ]
    rows, rejected = ray_events_to_rows(items)
    assert not rejected
    assert sum(1 for r in rows if r.get("state") is None) == 2  # stored, as Ray sent them
    return rows


@pytest.fixture(params=["fold", "scratch"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    root = tmp_path / "lake"
    rows = ray_rows()
    write_rows(local_put(root), rows[:4], "part-00001.parquet")  # split over two files
    write_rows(local_put(root), rows[4:], "part-00002.parquet")
    return Store(StoreOptions(str(root), refresh_s=0.0, fold=request.param == "fold",
                              cache_dir=str(tmp_path / "cache")))


def by_task(store: Store) -> dict[tuple[str, int], dict[str, Any]]:
    """Task rows by (the base64 task id Ray sent, attempt): the rows hold it as hex."""
    result = store.execute("SELECT * FROM tasks")
    return {(base64.b64encode(bytes.fromhex(r["task_id"])).decode(), r["attempt"]): r
            for r in result.records()}


def test_a_restarted_actor_attempt_takes_the_name_of_its_first_attempt(store: Store) -> None:
    tasks = by_task(store)
    assert tasks[(ACTOR_INIT, 0)]["name"] == "Counter.__init__"
    restarted = tasks[(ACTOR_INIT, 1)]
    assert restarted["name"] == "Counter.__init__" and restarted["final_state"] == "RUNNING"


def test_an_attempt_no_definition_names_takes_the_actor_repr(store: Store) -> None:
    assert by_task(store)[(NO_DEFINITION, 0)]["name"] == "Counter(7)"


def test_lifecycle_events_without_a_transition_make_no_row(store: Store) -> None:
    tasks = by_task(store)
    assert (STATELESS_ONLY, 0) not in tasks
    joined = tasks[(STATELESS_THEN_RUNNING, 0)]
    assert joined["final_state"] == "RUNNING" and joined["pid"] == 42  # its pid joins
    assert {t["final_state"] for t in tasks.values()} == {"FAILED", "RUNNING"}  # no UNKNOWN


def test_the_summary_counts_what_the_view_shows(store: Store) -> None:
    summary = {(r["dimension"], r["value"]): r for r in queries.summary(store).records()}
    assert summary[("all", None)]["tasks"] == 4
    assert summary[("name", "Counter.__init__")]["tasks"] == 2
    assert summary[("name", "Counter(7)")]["tasks"] == 1
    assert ("state", "UNKNOWN") not in summary


def test_the_fold_and_tasks_sql_agree(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    rows = ray_rows()
    for index, row in enumerate(rows):  # one file per event, in arrival order
        write_rows(local_put(root), [row], f"part-{index:05d}.parquet")
    cached = Store(StoreOptions(str(root), refresh_s=0.0, cache_dir=str(tmp_path / "c")))
    scratch = Store(StoreOptions(str(root), refresh_s=0.0, fold=False))
    sql = "SELECT * FROM tasks ORDER BY task_id, attempt"
    assert cached.execute(sql).rows == scratch.execute(sql).rows
    assert_same_figures(queries.summary(cached).rows, queries.summary(scratch).rows)
    cached.close()
    scratch.close()
