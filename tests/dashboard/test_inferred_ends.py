"""Ends evagg infers for attempts left open (dashboard/sql/ends.sql), as every view reads
them: an exported job end, worker death or node death ends the attempts Ray's GCS would
fail; an agent gone silent ends what was open on its node; a real end that arrives
later wins. Each case is read with the incremental fold and with tasks.sql alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.lakegen import Row, event, local_put, write_rows

SESSION = "session_2026-12-01_10-00-00_000000_1"
NOW_NS = [time.time_ns()]  # each test's own "now" (the ends depend on the reader's clock)


@pytest.fixture(autouse=True)
def now() -> None:
    NOW_NS[0] = time.time_ns()


def ago(seconds: float) -> int:
    return NOW_NS[0] - round(seconds * 1e9)


def ray_row(**fields: Any) -> Row:
    attrs = {"ray_session": SESSION, **fields.pop("attrs", {})}
    return event(source="ray", host="head", attrs=attrs, **fields)


def attempt(task_id: str, job: str, *, running: bool, pid: int = 0, start: float = 600,
            node: str = "n1") -> list[Row]:
    """An attempt left open: defined and pending, and running when `running` is set."""
    common: dict[str, Any] = {"kind": "task", "task_id": task_id, "attempt": 0, "job_id": job}
    rows = [ray_row(**common, name=f"f_{task_id}", state="DEFINED", time=ago(start)),
            ray_row(**common, state="PENDING", time=ago(start), node_id=node)]
    if running:
        rows.append(ray_row(**common, state="RUNNING", time=ago(start - 1), node_id=node,
                            attrs={"worker_pid": str(pid)}))
    return rows


def finished(task_id: str, job: str, *, at_s: float, node: str = "n1") -> Row:
    return ray_row(kind="task", task_id=task_id, attempt=0, job_id=job, state="FINISHED",
                   time=ago(at_s), node_id=node, worker_id="w-" + task_id)


@pytest.fixture(params=[True, False], ids=["fold", "tasks.sql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    stores: list[Store] = []

    def make(root: Path) -> Store:
        store = Store(StoreOptions(str(root), refresh_s=0.0, fold=request.param,
                                   cache_dir=str(tmp_path / "cache")))
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def tasks_of(store: Store) -> dict[str, dict[str, Any]]:
    result = store.execute("SELECT *, epoch_us(failed_at) AS failed_us FROM tasks "
                           "ORDER BY task_id")
    return {row["task_id"]: row for row in result.records()}


def states(store: Store) -> dict[str, int]:
    summary = store.execute(f"SELECT value, tasks FROM {store.summary_relation()} "
                            "WHERE dimension = 'state'")
    return {str(r["value"]): int(r["tasks"]) for r in summary.records()}


def test_a_driver_job_end_fails_its_open_attempts_as_rays_gcs_does(tmp_path: Path,
                                                                    open_store: Any) -> None:
    lake = tmp_path / "lake"
    rows = (attempt("run1", "01000000", running=True, pid=4242)
            + attempt("wait1", "01000000", running=False)
            + attempt("done1", "01000000", running=True, pid=4243)
            + [finished("done1", "01000000", at_s=590)]
            + attempt("other", "02000000", running=True, pid=4244)
            + [ray_row(kind="job", job_id="01000000", state="FINISHED", time=ago(500))])
    write_rows(local_put(lake), rows, "part-a.parquet")
    store = open_store(lake)
    tasks = tasks_of(store)

    running, waiting = tasks["run1"], tasks["wait1"]
    assert running["final_state"] == waiting["final_state"] == "FAILED"
    assert running["error_type"] == waiting["error_type"] == "WORKER_DIED"
    assert waiting["error_message"] == ("Job finishes (01000000) as driver exits. "
                                        "Marking all non-terminal tasks as failed.")
    assert "job 01000000 ended at" in running["inferred"]
    assert running["failed_us"] == ago(500) // 1000  # when the job's end was exported
    assert running["duration_s"] == pytest.approx(99.0, abs=0.01)  # from RUNNING to the end
    assert tasks["done1"]["final_state"] == "FINISHED" and tasks["done1"]["inferred"] is None
    assert tasks["other"]["final_state"] == "RUNNING"  # its job did not end
    assert states(store) == {"FAILED": 2, "FINISHED": 1, "RUNNING": 1}
    counts = store.execute("SELECT state, tasks FROM task_state_counts"
                           if store.fold else
                           "SELECT final_state AS state, count(*) AS tasks FROM tasks GROUP BY 1")
    assert {r["state"]: r["tasks"] for r in counts.records()} == states(store)
    jobs = {r["job_id"]: r for r in store.execute("SELECT * FROM jobs").records()}
    assert (jobs["01000000"]["status"], jobs["01000000"]["how_known"]) == ("SUCCEEDED",
                                                                         "exported by Ray")


def test_a_worker_or_node_death_fails_what_ran_there(tmp_path: Path, open_store: Any) -> None:
    lake = tmp_path / "lake"
    rows = (attempt("on_dead_worker", "01000000", running=True, pid=77, node="n1")
            + attempt("same_pid_elsewhere", "01000000", running=True, pid=77, node="n2")
            + attempt("on_dead_node", "01000000", running=True, pid=88, node="n3")
            + attempt("queued_on_n1", "01000000", running=False, node="n1")
            + [ray_row(kind="worker", worker_id="wdead", node_id="n1", state="DEFINED",
                       time=ago(700), attrs={"worker_pid": "77"}),
               ray_row(kind="worker", worker_id="wdead", state="DEAD", time=ago(300),
                       error_type="SYSTEM_ERROR"),
               ray_row(kind="node", node_id="n3", state="DEAD", time=ago(200))])
    write_rows(local_put(lake), rows, "part-a.parquet")
    tasks = tasks_of(open_store(lake))

    worker = tasks["on_dead_worker"]
    assert (worker["final_state"], worker["error_type"]) == ("FAILED", "WORKER_DIED")
    assert "worker wdead (pid 77) died" in worker["inferred"]
    assert tasks["same_pid_elsewhere"]["final_state"] == "RUNNING"  # another node's pid 77
    node = tasks["on_dead_node"]
    assert (node["final_state"], node["error_type"]) == ("FAILED", "NODE_DIED")
    assert tasks["queued_on_n1"]["final_state"] == "PENDING"  # it never ran on that worker


def test_a_real_end_arriving_later_wins_over_every_inferred_one(tmp_path: Path,
                                                                open_store: Any) -> None:
    lake = tmp_path / "lake"
    put = local_put(lake)
    write_rows(put, attempt("late", "01000000", running=True, pid=5)
               + attempt("agent_said", "01000000", running=True, pid=6)
               + [ray_row(kind="job", job_id="01000000", state="FINISHED", time=ago(500)),
                  # what an agent writes when it saw the worker's process gone
                  event(kind="task", source="evagg", task_id="agent_said", attempt=0,
                        job_id="01000000", state="FAILED", time=ago(400), host="head",
                        error_type="WORKER_DIED", error_message="The worker died.",
                        attrs={"ray_session": SESSION,
                               "evagg_inferred": "inferred by evagg on head: pid 6 gone"})],
               "part-a.parquet")
    store = open_store(lake)
    before = tasks_of(store)
    assert before["late"]["final_state"] == "FAILED"
    assert before["agent_said"]["inferred"] == "inferred by evagg on head: pid 6 gone"
    assert before["agent_said"]["failed_at"] is not None

    # Both real ends are older than the inferred ones: rank, not time, decides.
    write_rows(put, [finished("late", "01000000", at_s=550),
                     finished("agent_said", "01000000", at_s=560)], "part-b.parquet")
    after = tasks_of(store)
    for task_id in ("late", "agent_said"):
        row = after[task_id]
        assert (row["final_state"], row["inferred"], row["error_type"]) == ("FINISHED", None,
                                                                            None), task_id
        assert row["failed_at"] is None
    assert states(store) == {"FINISHED": 2}


def heartbeat(host: str, seconds_ago: float, silent_after_s: float) -> Row:
    return event(kind="agent", source="evagg", name="heartbeat", state="RUNNING", host=host,
                 node_id=host, time=ago(seconds_ago),
                 attrs={"silent_after_s": str(silent_after_s)})


def test_open_attempts_end_with_a_node_whose_agent_fell_silent(tmp_path: Path,
                                                               open_store: Any) -> None:
    lake = tmp_path / "lake"
    own = {"kind": "task", "source": "evagg", "name": "train", "state": "RUNNING"}
    rows = [event(**own, task_id="t-dead", host="gone", time=ago(900), pid=10),
            event(**own, task_id="t-live", host="alive", time=ago(900), pid=11),
            heartbeat("gone", 600, 90), heartbeat("alive", 1, 90)]
    # a Ray session that another live agent still reports keeps its attempts open
    rows += [dict(r, host="gone") for r in attempt("ray_open", "01000000", running=True,
                                                   pid=12)]
    rows += [dict(r, host="alive") for r in attempt("ray_peer", "01000000", running=True,
                                                    pid=13)]
    write_rows(local_put(lake), rows, "part-a.parquet")
    tasks = tasks_of(open_store(lake))

    dead = tasks["t-dead"]
    assert (dead["final_state"], dead["error_type"]) == ("FAILED", "NODE_DIED")
    assert "the agent on gone last reported at" in dead["inferred"]
    assert tasks["t-live"]["final_state"] == "RUNNING"
    assert tasks["ray_open"]["final_state"] == "RUNNING"
    assert tasks["ray_peer"]["final_state"] == "RUNNING"


def test_a_ray_session_no_live_agent_reports_ends_with_its_silent_nodes(
        tmp_path: Path, open_store: Any) -> None:
    lake = tmp_path / "lake"
    rows = [dict(r, host="gone") for r in attempt("ray_open", "01000000", running=True, pid=12)]
    rows += [heartbeat("gone", 500, 90),
             ray_row(kind="job", job_id="01000000", state="DEFINED", time=ago(610))]
    write_rows(local_put(lake), rows, "part-a.parquet")
    store = open_store(lake)
    row = tasks_of(store)["ray_open"]
    job = store.execute("SELECT * FROM jobs").records()[0]
    assert job["status"] == "SUCCEEDED"
    assert job["how_known"].startswith("evagg inferred this end: no agent of this Ray session")
    assert (row["final_state"], row["error_type"]) == ("FAILED", "NODE_DIED")
    assert row["failed_us"] == ago(500) // 1000  # the node's last heartbeat


def test_a_task_left_running_on_an_agent_that_died_reads_ended_with_its_node(
        agent_factory: Any, tmp_path: Path) -> None:
    """As a user meets it: a task RUNNING on a node whose agent was SIGKILLed (the node
    died with it) reads FAILED, NODE_DIED, inferred, once the agent is silent for
    longer than its heartbeats said it may be; `evagg status`-free, from the lake alone."""
    import json
    import os
    import subprocess
    import sys

    from tests.waiting import wait_for

    # The agent's own inference waits its grace (an hour here): only readers end it.
    agent = agent_factory(agent_toml='inferred_end_grace = "1h"').start()
    evagg = str(Path(sys.executable).with_name("evagg"))
    env = {**os.environ, "EVAGG_SOCKET": str(agent.socket_path),
           "EVAGG_CACHE_DIR": str(tmp_path / "cache")}
    sent = subprocess.run([evagg, "emit", "--kind", "task", "--name", "train_epoch",
                           "--state", "RUNNING", "--field", "task_id=t-node-died"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    agent.wait_rows("SELECT * FROM events WHERE task_id = 't-node-died'", 1)
    agent.wait_rows("SELECT * FROM events WHERE kind = 'agent'", 1)
    agent.kill()

    def ended() -> dict[str, Any] | None:
        done = subprocess.run([evagg, "query", "tasks", "--data", str(agent.lake_dir),
                               "--json", "--name", "train_epoch"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        return rows[0] if rows and rows[0]["final_state"] == "FAILED" else None

    row = wait_for(ended, 60, "the task to read ended with its silent node", interval=1.0)
    assert row["error_type"] == "NODE_DIED"
    assert "last reported at" in row["inferred"]


def test_the_dashboard_marks_inferred_ends_and_silent_agents(tmp_path: Path) -> None:
    """At 1280 px: the tasks table marks an inferred end (hovering says how evagg knows),
    a real end is not marked, the task page says how the end is known, and the Agents
    page says which agent fell silent."""
    from tests.dashboard.chromium import chromium, tab
    from tests.dashboard.serve import serving

    lake = tmp_path / "lake"
    rows = [dict(r, host="gone") for r in attempt("lost_one", "01000000", running=True,
                                                  pid=12)]
    rows += [dict(r, host="gone") for r in attempt("kept_one", "01000000", running=True,
                                                   pid=13)]
    rows += [dict(finished("kept_one", "01000000", at_s=590), host="gone"),
             heartbeat("gone", 500, 90)]
    write_rows(local_put(lake), rows, "part-a.parquet")
    store = Store(StoreOptions(str(lake), refresh_s=0.0, cache_dir=str(tmp_path / "cache")))
    try:
        with serving(store) as url, chromium() as browser, \
                tab(browser, url, width=1280, height=900) as page:
            page.goto("/#/tasks")
            lost = page.locator("tr", has=page.locator("a", has_text="lost_one"))
            badge = lost.locator("td[data-col=final_state] .badge")
            assert badge.inner_text() == "FAILED*"
            assert "the agent on gone last reported at" in (badge.get_attribute("title") or "")
            kept = page.locator("tr", has=page.locator("a", has_text="kept_one"))
            assert kept.locator("td[data-col=final_state] .badge").inner_text() == "FINISHED"
            lost.locator("td[data-col=task_id] a").click()
            known = page.locator("h3, h2", has_text="How this end is known")
            known.wait_for()
            assert "inferred by evagg" in page.locator("dl.meta").inner_text()
            page.goto("/#/agents")
            state = page.locator("td[data-col=state]", has_text="silent")
            assert state.inner_text() == "silent: taken for dead"
    finally:
        store.close()


def test_a_driver_tasks_exported_end_ends_its_job_and_what_it_left(tmp_path: Path,
                                                                  open_store: Any) -> None:
    """Ray often exports the driver task's FINISHED and not the job's: the job reads ended
    then (evagg query jobs), and so do the attempts the driver left open."""
    lake = tmp_path / "lake"
    driver = "ffffffffffffffffffffffffffffffffffffffff01000000"
    common = {"kind": "task", "task_id": driver, "attempt": 0, "job_id": "01000000"}
    rows = [ray_row(**common, state="RUNNING", time=ago(700),
                    attrs={"ray_task_type": "DRIVER_TASK"}),
            ray_row(**common, state="FINISHED", time=ago(400)),
            ray_row(kind="job", job_id="01000000", state="DEFINED", time=ago(700))]
    rows += attempt("left", "01000000", running=True, pid=9)
    write_rows(local_put(lake), rows, "part-a.parquet")
    store = open_store(lake)
    left = tasks_of(store)["left"]
    assert (left["final_state"], left["error_type"]) == ("FAILED", "WORKER_DIED")
    assert left["failed_us"] == ago(400) // 1000
    job = store.execute("SELECT * FROM jobs").records()[0]
    assert (job["status"], job["how_known"]) == ("SUCCEEDED",
                                                 "its driver task's end, exported by Ray")
