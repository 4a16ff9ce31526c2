"""Ray's own tools against `evagg dashboard` after the cluster is gone.

Two real Ray sessions (the end-to-end workload: plain tasks, failures, a retried task
whose worker dies, nested tasks, an actor with a failing method; then a small second
job) export into one real agent. While each lives, the test records what Ray's State
API says; then Ray is shut down, the dashboard serves the agent's lake, and the real
`ray` CLI and `ray.util.state` ask it the same questions. One module-scoped run: Ray
is slow to start on a small machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess, query_lake
from tests.dashboard.rayrecord import Recorded, record_session, second_workload
from tests.dashboard.serve import serving
from tests.raycli import RAY

pytestmark = pytest.mark.slow
EVAGG = str(Path(sys.executable).with_name("evagg"))
TASK_KEYS = ("name", "state", "type", "func_or_class_name", "job_id", "actor_id",
             "parent_task_id", "error_type", "worker_pid", "fallback_strategy")


@dataclass
class Live:
    url: str
    first: Recorded
    second: Recorded
    lake: Path

    @property
    def first_url(self) -> str:
        """The first session's address: its name in the path (the newest is the default)."""
        return f"{self.url}/ray/{self.first.session}"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    work = tmp_path_factory.mktemp("raystate")
    agent = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    try:
        first = record_session(agent, work)
        second = record_session(agent, work, second_workload)
    finally:
        agent.stop()
    store = Store(StoreOptions(str(agent.lake_dir), refresh_s=60))
    with serving(store) as url:
        yield Live(url, first, second, agent.lake_dir)


def ray_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return subprocess.run([RAY, *args], capture_output=True, text=True, timeout=120, env=env,
                          check=False)


def by_attempt(tasks: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(t["task_id"], t["attempt_number"]): t for t in tasks}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return json.loads(answer.read())


def test_ray_cli_lists_the_tasks_ray_listed(live: Live) -> None:
    done = ray_cli("list", "tasks", "--address", live.first_url, "--detail", "--format", "json",
                   "--limit", "1000")
    assert done.returncode == 0, done.stderr
    ours, theirs = by_attempt(json.loads(done.stdout)), by_attempt(live.first.tasks)
    assert set(ours) == set(theirs)
    for key, ray_task in theirs.items():
        mine = ours[key]
        assert {k: mine[k] for k in TASK_KEYS} == {k: ray_task[k] for k in TASK_KEYS}, key
        for column in ("node_id", "worker_id"):  # Ray leaves them unset on actor creation
            if ray_task[column]:
                assert mine[column] == ray_task[column], (key, column)
        assert [e["state"] for e in mine["events"]] == [e["state"] for e in ray_task["events"]]


def test_state_api_in_python_gives_ray_s_details(live: Live) -> None:
    from ray.util.state import get_task, list_tasks

    ours = by_attempt([t.asdict() for t in list_tasks(address=live.first_url, detail=True,
                                                      limit=1000)])
    for key, ray_task in by_attempt(live.first.tasks).items():
        mine = ours[key]
        for column in ("creation_time_ms", "start_time_ms", "end_time_ms"):
            if ray_task[column] is not None:
                assert abs(mine[column] - ray_task[column]) <= 1, (key, column)
        for a, b in zip(mine["events"], ray_task["events"], strict=True):
            assert abs(a["created_ms"] - b["created_ms"]) <= 1, key
        assert mine["required_resources"] == ray_task["required_resources"], key
        assert mine["language"] == ray_task["language"]
        # A worker's death races in Ray itself: when the GCS learns of it before the
        # owner's FAILED event, it writes its own "Worker running the task ... died"
        # text into the attempt, which Event Export never carries; otherwise the owner's
        # (often empty) text stands. Only the exported text can be held to Ray's.
        if ray_task["error_message"] and ray_task["error_type"] != "WORKER_DIED":
            assert mine["error_message"].splitlines()[-1] == (
                ray_task["error_message"].splitlines()[-1]), key
        if ray_task["task_log_info"]:
            assert mine["task_log_info"] == ray_task["task_log_info"], key
        profile = ray_task["profiling_data"] or {}
        if profile.get("events"):
            names = sorted(e["event_name"] for e in mine["profiling_data"]["events"])
            assert names == sorted(e["event_name"] for e in profile["events"]), key
    flaky = next(t for t in live.first.tasks if t["name"] == "flaky")
    both = get_task(flaky["task_id"], address=live.first_url)
    assert isinstance(both, list) and sorted(t.attempt_number for t in both) == [0, 1]


def test_summaries_count_what_ray_counted(live: Live) -> None:
    from ray.util.state import summarize_actors, summarize_tasks

    assert summarize_tasks(address=live.first_url) == live.first.summary
    actors = summarize_actors(address=live.first_url)["cluster"]
    (counter,) = actors["summary"].values()
    assert counter["state_counts"] == {"DEAD": 1} and actors["total_actors"] == 1
    done = ray_cli("summary", "tasks", "--address", live.first_url)
    assert done.returncode == 0, done.stderr
    assert "total_tasks: 9" in done.stdout and "FAILED: 1" in done.stdout


def test_actors_jobs_and_nodes_are_ray_s(live: Live) -> None:
    from ray.util.state import list_actors, list_jobs, list_nodes, list_workers

    (actor,) = [a.asdict() for a in list_actors(address=live.first_url, detail=True)]
    (theirs,) = live.first.actors
    keys = ("actor_id", "class_name", "state", "job_id", "name", "node_id", "pid",
            "ray_namespace", "is_detached", "repr_name", "num_restarts", "required_resources")
    assert {k: actor[k] for k in keys} == {k: theirs[k] for k in keys}
    assert actor["death_cause"] == theirs["death_cause"]
    (job,) = [dict(j.asdict()) for j in list_jobs(address=live.first_url, detail=True)]
    (ray_job,) = live.first.jobs
    for key in ("job_id", "type", "entrypoint", "driver_info"):
        assert str(job[key]) == str(ray_job[key]), key
    # Ray's job table and its export stamp the start separately, a moment apart.
    assert abs(int(job["start_time"]) - int(ray_job["start_time"])) <= 1000
    # Ray was asked while the job ran; the job's end is exported at shutdown, not always
    # by a local cluster.
    assert str(ray_job["status"]).endswith("RUNNING")
    assert str(job["status"]).rsplit(".", 1)[-1] in ("RUNNING", "SUCCEEDED")
    (node,) = [n.asdict() for n in list_nodes(address=live.first_url, detail=True)]
    (ray_node,) = live.first.nodes
    for key in ("node_id", "node_ip", "is_head_node", "state", "node_name", "resources_total",
                "labels", "start_time_ms"):
        assert node[key] == ray_node[key], key
    ray_workers = {w["worker_id"]: w for w in live.first.raw["workers?detail=1"]["data"]
                   ["result"]["result"] if w["worker_type"] == "WORKER"}
    workers = {w.worker_id: w.asdict() for w in list_workers(address=live.first_url,
                                                            detail=True)}
    assert set(workers) == set(ray_workers)  # Ray does not export its drivers
    for worker_id, ray_worker in ray_workers.items():
        for key in ("pid", "node_id", "ip", "worker_type", "start_time_ms"):
            assert workers[worker_id][key] == ray_worker[key], (worker_id, key)
        if not ray_worker["is_alive"]:
            assert workers[worker_id]["exit_type"] == ray_worker["exit_type"], worker_id


def test_ray_list_jobs_says_when_a_job_ended_as_evagg_query_jobs_does(live: Live) -> None:
    """One answer for a job's end: a local cluster exports its driver task's end at
    shutdown more often than the job's own, and `ray list jobs` against the dashboard
    reads the end `evagg query jobs` reads (not RUNNING, not a later inferred end)."""
    done = subprocess.run([EVAGG, "query", "--data", str(live.lake), "--no-cache", "--json",
                           "jobs"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for recorded in (live.first, live.second):
        (view,) = [j for j in json.loads(done.stdout) if j["ray_session"] == recorded.session]
        assert view["status"] == "SUCCEEDED", view  # its driver task's end, at least
        listed = ray_cli("list", "jobs", "--address", f"{live.url}/ray/{recorded.session}",
                         "--detail", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        (job,) = json.loads(listed.stdout)
        ended = datetime.fromisoformat(view["ended_at"].replace("Z", "+00:00"))
        assert (job["status"], job["end_time"]) == (
            "SUCCEEDED", int(ended.timestamp() * 1e6) // 1000), recorded.session
        exported = view["how_known"] == "exported by Ray"
        assert job["message"] == (None if exported else view["how_known"])


def test_filters_and_limits_behave_as_ray_s(live: Live) -> None:
    from ray.util.state import list_tasks

    squares = list_tasks(address=live.first_url, filters=[("name", "=", "SQUARE")], limit=100)
    assert len(squares) == 5  # strings compare without case, as Ray's do
    failed = list_tasks(address=live.first_url, filters=[("state", "!=", "finished")])
    assert sorted(t.name for t in failed) == ["Counter.fail", "boom", "flaky"]
    by_pid = list_tasks(address=live.first_url, filters=[
        ("worker_pid", "=", str(squares[0].worker_pid)), ("name", "=", "square")])
    assert by_pid and all(t.worker_pid == squares[0].worker_pid for t in by_pid)

    envelope = get_json(f"{live.first_url}/api/v0/tasks?limit=2")
    assert envelope["result"] is True and envelope["msg"] == ""
    page = envelope["data"]["result"]
    assert (len(page["result"]), page["num_filtered"], page["total"]) == (2, 12, 12)
    assert [t["task_id"] for t in page["result"]] == sorted(t["task_id"] for t in page["result"])
    done = ray_cli("list", "tasks", "--address", live.first_url, "--limit", "2")
    assert done.returncode == 0 and "Limit last 2 entries (Total 12)" in done.stderr
    with_driver = get_json(f"{live.first_url}/api/v0/tasks?exclude_driver=0")["data"]["result"]
    assert with_driver["total"] == 13 and any(
        t["type"] == "DRIVER_TASK" for t in with_driver["result"])

    done = ray_cli("list", "tasks", "--address", live.first_url, "--filter", "worker_pid=x")
    assert done.returncode != 0 and "Invalid filter `--filter worker_pid x`" in (
        done.stdout + done.stderr)
    bad = urllib.request.Request(f"{live.first_url}/api/v0/tasks?filter_keys=events&"
                                 "filter_predicates=%3D&filter_values=1")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bad, timeout=30)
    body = json.loads(refused.value.read())
    assert refused.value.code == 400 and body["result"] is False
    assert "filter column events is not supported" in body["msg"]


def test_two_sessions_in_one_store_stay_apart(live: Live) -> None:
    from ray.util.state import list_tasks

    listed = get_json(f"{live.url}/api/ray/sessions")["sessions"]
    assert [s["session"] for s in listed] == [live.second.session, live.first.session]
    newest = list_tasks(address=live.url)  # no session named: the newest
    assert sorted(t.name for t in newest) == ["second_only"] * 3
    assert live.first.job_id == live.second.job_id  # both started their ids again
    first = list_tasks(address=live.first_url, limit=1000)
    assert "second_only" not in {t.name for t in first} and len(first) == 12
    short = f"{live.url}/ray/{live.second.session[:-2]}"  # a unique prefix is enough
    assert {t.name for t in list_tasks(address=short)} == {"second_only"}
    done = ray_cli("list", "tasks", "--address", f"{live.url}/ray/session_1999")
    assert done.returncode != 0 and "no Ray session 'session_1999'" in done.stdout + done.stderr


def test_timeline_slices_match_ray_timeline(live: Live, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = subprocess.run([EVAGG, "query", "--data", str(live.lake), "--no-cache", "timeline",
                           "--job", live.first.job_id, "--session", live.first.session,
                           "--out", str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    assert isinstance(trace, list) and all(e["ph"] in ("X", "M") for e in trace)
    assert all(isinstance(e["pid"], int) for e in trace)  # what Perfetto accepts
    slices = [e for e in trace if e["ph"] == "X"]
    theirs = [e for e in live.first.timeline if e["ph"] == "X"]
    ours = [e for e in slices if e["args"].get("evagg_from") != "task_events"]
    assert len(ours) == len(theirs)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
               if e["name"] == "thread_name"}

    def key(e: dict[str, Any], worker: str) -> tuple[str, str, int]:
        return (worker, e["cat"], round(e["ts"] / 1000))  # to the millisecond

    ray_keys = sorted(key(e, e["tid"]) for e in theirs)
    our_keys = sorted(key(e, threads[(e["pid"], e["tid"])]) for e in ours)
    assert [(w, c) for w, c, _ in our_keys] == [(w, c) for w, c, _ in ray_keys]
    ray_exec = {e["args"]["task_id"]: e for e in theirs if e["cat"].startswith("task::")}
    our_exec = {e["args"]["task_id"]: e for e in ours if e["cat"].startswith("task::")}
    assert set(our_exec) == set(ray_exec)
    for task_id, ray_slice in ray_exec.items():
        mine = our_exec[task_id]
        assert mine["name"] == ray_slice["name"]
        assert abs(mine["ts"] - ray_slice["ts"]) < 1000, task_id
        assert abs(mine["ts"] + mine["dur"] - ray_slice["ts"] - ray_slice["dur"]) < 1000
    # Ray's own route for the dashboard's "Download timeline" gives the same trace.
    served = get_json(f"{live.first_url}/api/v0/tasks/timeline?job_id={live.first.job_id}")
    assert served == trace
    # Only the attempt whose worker died lacks a profile; when its RUNNING arrived, it
    # still gets a slice from its task events (Ray's timeline has none).
    died = [e for e in slices if e["args"].get("evagg_from") == "task_events"]
    assert {(e["cat"], e["args"]["attempt_number"]) for e in died} <= {("task::flaky", 0)}


def test_what_is_not_served_says_why(live: Live) -> None:
    done = ray_cli("list", "objects", "--address", live.url)
    assert done.returncode != 0
    assert "objects are not exported by Ray" in done.stdout + done.stderr
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{live.url}/api/v0/runtime_envs", timeout=30)
    assert refused.value.code == 404
    assert "runtime environments are not exported" in json.loads(refused.value.read())["msg"]


def test_placement_groups_are_ray_s_where_ray_exported_them(live: Live) -> None:
    """Ray 2.60 exported no placement-group events from this local cluster (with
    EXPOSABLE_EVENT_TYPES=ALL); the list is then empty, in Ray's envelope."""
    from ray.util.state import list_placement_groups

    ours = [g.asdict() for g in list_placement_groups(address=live.url, detail=True)]
    assert live.second.placement_groups  # Ray's own list had the group
    exported = query_lake(live.lake, "SELECT count(*) FROM events WHERE kind = 'ray' AND "
                                     "attrs['ray_event_type'] LIKE 'PLACEMENT_GROUP_%'")
    if not exported[0][0]:
        assert ours == []
        return
    keys = ("placement_group_id", "name", "creator_job_id", "state", "is_detached")
    assert [{k: g[k] for k in keys} for g in ours] == [
        {k: g[k] for k in keys} for g in live.second.placement_groups]
