"""Task timelines: Ray's Chrome trace, and the lanes the dashboard's timeline page draws.

`chrome_trace` writes what Ray's dashboard writes for "Download timeline"
(`ray._private.profiling.chrome_tracing_dump`): one complete event ("ph": "X") per
profile entry Ray recorded (`task::<name>` around the whole execution, then
`task:deserialize_arguments`, `task:execute`, `task:store_outputs`), named and
coloured as Ray names them, with numbered processes (one per node, "Node <ip>") and
threads (one per worker, "worker:<id>") named by metadata events, which Perfetto and
chrome://tracing both read (`ray timeline` writes the same slices with the ip and the
worker as the pid and tid themselves, which Perfetto refuses). A task with no profile
entries (Ray exports them only with EXPOSABLE_EVENT_TYPES=ALL) still gets one
`task::<name>` slice from its RUNNING to its end, from the `tasks` view (its args say
"evagg_from": "task_events"), as does an attempt whose worker died before flushing them.

`lanes` is the dashboard page's data: every task attempt of a job as one bar per
worker, in columns (not one object per bar), so 100,000 tasks stay a few MB.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dashboard.lake.errors import NotFound
from dashboard.lake.store import Store
from dashboard.raystate.rows import func_or_class_name, json_or

# ray._private.profiling._default_color_mapping
COLORS = {
    "worker_idle": "cq_build_abandoned", "task": "rail_response",
    "task:deserialize_arguments": "rail_load", "task:execute": "rail_animation",
    "task:store_outputs": "rail_idle", "wait_for_function": "detailed_memory_dump",
    "ray.get": "good", "ray.put": "terrible", "ray.wait": "vsync_highlight_color",
    "submit_task": "background_memory_dump", "fetch_and_run_function": "detailed_memory_dump",
    "register_remote_function": "detailed_memory_dump",
}
PROFILE = """
SELECT p.task_id, coalesce(p.attempt, 0) AS attempt, p.job_id, p.name AS event_name,
       epoch_us(p.time) AS us, p.duration_s, p.worker_id,
       p.attrs['ray_node_ip_address'] AS node_ip, p.attrs['ray_component_type'] AS component,
       p.attrs['ray_extra_data'] AS extra
FROM events_raw AS p
WHERE p.kind = 'ray_profile' AND p.source = 'ray'
  AND coalesce(p.attrs['ray_session'], '') = $session AND ($job = '' OR p.job_id = $job)
"""
TASKS = """
SELECT task_id, attempt, job_id, name, function, task_type, actor_id, final_state, node_id,
       worker_id, pid, epoch_us(running_at) AS start_us,
       epoch_us(coalesce(finished_at, failed_at)) AS end_us,
       epoch_us(coalesce(submitted_at, pending_at)) AS queued_us
FROM tasks
WHERE source = 'ray' AND coalesce(ray_session, '') = $session AND ($job = '' OR job_id = $job)
  AND coalesce(task_type, '') <> 'DRIVER_TASK'
"""
# The most bars the timeline page gets (about 80 bytes of JSON each): a job with more
# shows its earliest this many and says so.
MAX_BARS = 250_000
NODE_IPS = """
SELECT node_id, max(attrs['ray_node_ip_address']) AS ip FROM events_raw
WHERE kind = 'node' AND source = 'ray' AND coalesce(attrs['ray_session'], '') = $session
GROUP BY node_id
"""


def _call_string(task: dict[str, Any]) -> str:
    return func_or_class_name(task.get("function") or task.get("name"), task.get("task_type"))


class _Tracks:
    """Ray's numbering: nodes and (node, worker) pairs in order of first use."""

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.workers: dict[tuple[int, str], int] = {}

    def of(self, node: str, worker: str) -> tuple[int, int]:
        pid = self.nodes.setdefault(node, len(self.nodes))
        tid = self.workers.setdefault((pid, worker), len(self.workers))
        return pid, tid

    def metadata(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [
            {"name": "process_name", "args": {"name": f"Node {node}"}, "pid": pid, "tid": None,
             "ph": "M"} for node, pid in self.nodes.items()]
        events += [{"name": "thread_name", "args": {"name": worker}, "pid": pid, "tid": tid,
                    "ph": "M"} for (pid, worker), tid in self.workers.items()]
        return events


def chrome_trace(store: Store, session: str, job: str = "") -> list[dict[str, Any]]:
    params = {"session": session, "job": job}
    tasks = {(r["task_id"], r["attempt"]): r
             for r in store.execute(TASKS, params, views=False).records()}
    profile = store.execute(PROFILE + " ORDER BY us", params).records()
    ips = {node: ip for node, ip in store.execute(NODE_IPS, {"session": session}).rows}
    tracks = _Tracks()
    events: list[dict[str, Any]] = []
    profiled: set[tuple[str, int]] = set()
    for p in profile:
        if p["component"] not in (None, "worker", "driver"):
            continue
        task = tasks.get((p["task_id"], p["attempt"]), {})
        profiled.add((p["task_id"], p["attempt"]))
        extra = json_or(p["extra"], {})
        extra = extra if isinstance(extra, dict) else {}
        name = str(p["event_name"] or "")
        cname = COLORS.get(str(extra.get("cname") or name), "generic_work")
        extra.update(task_id=p["task_id"], job_id=p["job_id"], attempt_number=p["attempt"],
                     func_or_class_name=_call_string(task) if task else None,
                     actor_id=task.get("actor_id"))
        # A driver's profile entries arrive without its worker id, which Ray derives
        # from the job id: the job's 4 bytes, then 24 bytes of ff.
        component = str(p["component"] or "worker")
        worker_id = p["worker_id"] or (f"{p['job_id']}{'ff' * 24}"
                                       if component == "driver" and p["job_id"] else "")
        worker = f"{component}:{worker_id}" if worker_id else component
        pid, tid = tracks.of(p["node_ip"] or "", worker)
        events.append({"cat": name, "name": extra.get("name", name), "pid": pid, "tid": tid,
                       "ts": float(p["us"]), "dur": float((p["duration_s"] or 0) * 1e6),
                       "cname": cname, "args": extra, "ph": "X"})
    for key, task in tasks.items():
        if key in profiled or task["start_us"] is None or task["end_us"] is None:
            continue
        node = ips.get(task["node_id"]) or task["node_id"] or ""
        pid, tid = tracks.of(node, f"worker:{task['worker_id']}")
        func = _call_string(task)
        events.append({
            "cat": f"task::{func}", "name": task["function"] or func, "pid": pid, "tid": tid,
            "ts": float(task["start_us"]), "dur": float(task["end_us"] - task["start_us"]),
            "cname": COLORS["task"], "ph": "X",
            "args": {"task_id": task["task_id"], "job_id": task["job_id"],
                     "attempt_number": task["attempt"], "func_or_class_name": func,
                     "actor_id": task["actor_id"], "state": task["final_state"],
                     # not Ray's: this slice comes from the task's events, not a profile
                     "evagg_from": "task_events"}})
    return events + tracks.metadata()


def lanes(store: Store, session: str, job: str) -> dict[str, Any]:
    """Every attempt of `job` (the first MAX_BARS to start) as a bar on its worker's
    lane, in columns; times in milliseconds from the first bar (t0_us, epoch
    microseconds, is the job's own clock). A bar starts at RUNNING (else when it was
    queued) and ends at its end (else where it starts: still running when the store
    stopped hearing of it). Each lane names its node's ip (from Ray's node events) and
    its worker's pid (from the tasks view), so a person reads it without ids."""
    params = {"session": session, "job": job}
    rows = store.execute(TASKS + " ORDER BY start_us NULLS LAST LIMIT $cap",
                         {**params, "cap": MAX_BARS + 1}, views=False).records()
    total = None
    if len(rows) > MAX_BARS:  # tens of MB for the page: the earliest bars, and a count
        rows = rows[:MAX_BARS]
        total = int(store.execute(f"SELECT count(*) FROM ({TASKS})", params,
                                  views=False).rows[0][0])
    names: dict[str, int] = {}
    states: dict[str, int] = {}
    cols: dict[str, list[Any]] = defaultdict(list)
    timed = [r for r in rows if (r["start_us"] or r["queued_us"]) is not None]
    worker_of = _workers_by_pid(timed)
    keys = sorted({_lane_key(r, worker_of) for r in timed})
    lane_of = {key: index for index, key in enumerate(keys)}  # by node, then worker
    t0 = min((r["start_us"] or r["queued_us"] for r in timed), default=0)
    for r in timed:
        start = r["start_us"] or r["queued_us"]
        end = r["end_us"] or start
        key = _lane_key(r, worker_of)
        cols["lane"].append(lane_of[key])
        cols["start"].append(round((start - t0) / 1000, 3))
        cols["dur"].append(round(max(end - start, 0) / 1000, 3))
        cols["state"].append(states.setdefault(r["final_state"], len(states)))
        cols["name"].append(names.setdefault(r["name"] or "", len(names)))
        cols["task_id"].append(r["task_id"])
        cols["attempt"].append(r["attempt"])
    lane_list = _named_lanes(store, session, list(lane_of), timed)
    return {"session": session, "job": job, "t0_us": t0, "lanes": lane_list,
            "names": list(names), "states": list(states), "bars": dict(cols),
            "count": len(timed), "untimed": len(rows) - len(timed),
            "cut_from": total}


def _workers_by_pid(rows: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(node, pid) -> worker id, from the attempts that name both."""
    found: dict[tuple[str, int], str] = {}
    for r in rows:
        if r["worker_id"] and r["pid"] is not None:
            found.setdefault((r["node_id"] or "", int(r["pid"])), r["worker_id"])
    return found


def _lane_key(row: dict[str, Any], worker_of: dict[tuple[str, int], str]) -> tuple[str, str]:
    """An attempt's lane: its worker's. An actor's creation task names no worker (Ray's
    events give it none) but its pid, which names the worker that ran the actor's
    methods: the same lane, not one more labelled with the same pid."""
    node, worker = row["node_id"] or "", row["worker_id"] or ""
    if not worker and row["pid"] is not None:
        worker = worker_of.get((node, int(row["pid"])), "")
    return node, worker


def _named_lanes(store: Store, session: str, keys: list[tuple[str, str]],
                 rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lanes, each with its node's ip and its worker's pid (None where not known)."""
    ips = {node: ip for node, ip in store.execute(NODE_IPS, {"session": session}).rows}
    pids: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["pid"] is not None:
            pids.setdefault((r["node_id"] or "", r["worker_id"] or ""), int(r["pid"]))
    return [{"node_id": n, "worker_id": w, "ip": ips.get(n), "pid": pids.get((n, w))}
            for (n, w) in keys]


def write_trace(store: Store, session: str | None, job: str, out: str) -> dict[str, Any]:
    """`evagg query timeline`: the trace written to `out`; returns what was written."""
    import json

    from dashboard.raystate.sessions import job_in_session

    job, chosen = job_in_session(store, job, session)
    events = chrome_trace(store, chosen, job)
    if not any(e["ph"] == "X" for e in events):  # nothing to write: say so, write nothing
        which = f"job {job}" if job else "any job"
        raise NotFound(f"no Ray tasks of {which} in session {chosen} (`evagg query jobs` "
                       "lists the jobs, each with its session)")
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(events, handle)
    slices = [e for e in events if e["ph"] == "X"]
    attempts = {(r["task_id"], r["attempt"]) for r in store.execute(
        TASKS, {"session": chosen, "job": job}, views=False).records()}
    drawn = {(e["args"]["task_id"], e["args"].get("attempt_number")) for e in slices}
    return {"file": out, "session": chosen, "job": job or "(every job)",
            "slices": len(slices), "tasks": len({e["args"]["task_id"] for e in slices}),
            "tracks": sum(e["name"] == "thread_name" for e in events),
            # never started on a worker, or its worker died before saying so: no slice
            "attempts_not_drawn": len(attempts - drawn)}
