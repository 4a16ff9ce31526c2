"""A real Ray session exporting into a real agent, and Ray's own State API answers
recorded while it lives, for the tests that compare evagg's answers with Ray's.

`record_session` runs the workload of tests/rayexport.py (plain tasks, failures, a
retried task whose worker dies, nested tasks, an actor with a failing method), waits
until Ray's State API has every attempt settled and every profile event flushed, records
what Ray says (the State API, its raw HTTP envelopes, `ray.timeline()`), shuts Ray down
and waits until the agent delivered every event to its lake.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.agentproc import AgentProcess
from tests.rayexport import RAY_EXPORT_ENV, ray_state_tasks, run_workload
from tests.raylocal import local_ray
from tests.waiting import wait_for, wait_until

EXPORT_ALL = {**RAY_EXPORT_ENV, "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES": "ALL"}
RAW_ROUTES = ("tasks?limit=1000&detail=1", "actors?detail=1", "nodes?detail=1",
              "jobs?detail=1", "workers?detail=1", "tasks/summarize", "actors/summarize")


@dataclass
class Recorded:
    """What Ray answered while the session lived."""

    job_id: str
    session: str
    outer_id: str
    tasks: list[dict[str, Any]] = field(default_factory=list)  # list_tasks(detail=True)
    summary: dict[str, Any] = field(default_factory=dict)  # summarize_tasks()
    actors: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    placement_groups: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)  # route -> Ray's JSON envelope
    timeline: list[dict[str, Any]] = field(default_factory=list)  # ray.timeline()


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def second_workload(_flag_dir: str) -> dict[str, Any]:
    """A different, smaller job for a second session: three tasks of its own name, run
    in a placement group that is then removed."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote
    def second_only(x: int) -> int:
        return x + 1

    group = placement_group([{"CPU": 1}], name="second-group")
    ray.get(group.ready(), timeout=60)
    strategy = PlacementGroupSchedulingStrategy(placement_group=group)
    placed = second_only.options(scheduling_strategy=strategy)
    assert ray.get([placed.remote(i) for i in range(3)]) == [1, 2, 3]
    remove_placement_group(group)
    return {"outer_id": "", "attempts": 3}


def record_session(agent: AgentProcess, flag_dir: Path,
                   workload: Callable[[str], dict[str, Any]] = run_workload) -> Recorded:
    """One Ray session exporting to `agent`, its workload run and Ray's answers recorded."""
    import ray
    from ray.util import state

    env = {**EXPORT_ALL, "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR":
           f"{agent.http_url}/ray/events"}
    with local_ray(env) as job_id:
        ran = workload(str(flag_dir))
        session = ray._private.worker.global_worker.node.session_name
        assert session_processes(session), "no process names the session: nothing to wait on"
        ray_state_tasks(job_id, ran["attempts"])  # every attempt settled in Ray
        recorded = Recorded(job_id=job_id, session=session, outer_id=ran["outer_id"])
        # Ray's State API of this cluster, named: without an address it looks for a
        # cluster on the machine, and fails when another one runs there too.
        webui = ray._private.worker.global_worker.node.address_info["webui_url"]
        address = f"http://{webui}"
        # The lake gets profile events until shutdown; Ray's own answers must hold them
        # all too, however late a loaded machine lets the workers flush them.
        recorded.tasks, recorded.timeline = _settled_tasks_and_timeline(address)
        recorded.summary = state.summarize_tasks(address=address,
                                                 raise_on_missing_output=False)
        recorded.actors = [a.asdict() for a in state.list_actors(address=address, detail=True)]
        recorded.jobs = [dict(j.asdict()) for j in state.list_jobs(address=address,
                                                                   detail=True)]
        recorded.nodes = [n.asdict() for n in state.list_nodes(address=address, detail=True)]
        recorded.placement_groups = [g.asdict() for g in state.list_placement_groups(
            address=address, detail=True)]
        for route in RAW_ROUTES:
            recorded.raw[route] = _get_json(f"http://{webui}/api/v0/{route}")
    _wait_all_delivered(agent, session)
    return recorded


def _settled_tasks_and_timeline(
        address: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Ray's task list (detail) and `ray.timeline()` once every profile is in both and
    neither changed between two polls (each poll spans more than Ray's 1 s flush, as
    `ray.timeline()` itself waits a second)."""
    import ray
    from ray.util import state

    last: list[str | None] = [None]

    def poll() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        tasks = [t.asdict() for t in state.list_tasks(
            address=address, detail=True, limit=10000, raise_on_missing_output=False)]
        timeline: list[dict[str, Any]] = ray.timeline() or []
        now = _canonical(tasks) + _canonical(timeline)
        stable, last[0] = now == last[0], now
        return (tasks, timeline) if stable and _profiles_complete(tasks, timeline) else None

    settled: tuple[list[dict[str, Any]], list[dict[str, Any]]] = wait_for(
        poll, 60, "Ray's task list and timeline to hold every profile", interval=0.5)
    return settled


def _canonical(rows: list[dict[str, Any]]) -> str:
    return json.dumps(sorted(json.dumps(r, sort_keys=True, default=str) for r in rows))


def _profiles_complete(tasks: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> bool:
    """Every attempt of these workloads ran its code, except one whose worker died (its
    profile died with it): each other one has its start, its `task::` profile event and its
    `task::` slice; and every task has the `submit_task` slice of whoever submitted it
    (the driver's are in no task of the list)."""
    ran = [t for t in tasks if t["error_type"] != "WORKER_DIED"]
    slices = Counter(e["args"].get("task_id") for e in timeline
                     if e["ph"] == "X" and e["cat"].startswith("task::"))
    submitted = sum(1 for e in timeline if e["ph"] == "X" and e["cat"] == "submit_task")
    return (slices == Counter(t["task_id"] for t in ran)
            and submitted >= len({t["task_id"] for t in tasks})
            and all(t["start_time_ms"] is not None and _profiled(t) for t in ran))


def _profiled(task: dict[str, Any]) -> bool:
    events = (task["profiling_data"] or {}).get("events") or []
    return any(e["event_name"].startswith("task::") for e in events)


def _wait_all_delivered(agent: AgentProcess, session: str) -> None:
    """Until every process of the Ray session is gone (its exporter, which may post a last
    batch while it stops, included) and the lake holds everything the agent received."""
    wait_until(lambda: not session_processes(session), 60,
               f"the processes of Ray's {session} to exit")
    received = agent.metric("evagg_received_events_total{")
    agent.wait_delivered(int(received))


def session_processes(session: str) -> list[int]:
    """Live processes whose command line names the Ray session (zombies excluded)."""
    marker = session.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in args and state != "Z":
            found.append(int(entry.name))
    return found
