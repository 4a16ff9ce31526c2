"""Real Ray exporting its events to a real evagg agent: the `tasks` view built from the
Parquet lake agrees with Ray's own State API, and a slow answer (Ray resends the batch
after its 3 s timeout) stores no duplicate rows.

One local Ray cluster for the module. Ray reads the export settings from the
environment when it starts, so they are set before ray.init and restored after. A small
proxy between Ray and the agent can hold one request back to make Ray time out.
"""

from __future__ import annotations

import hashlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProcess
from tests.rayexport import (
    OTHER_TESTS_TASK,
    RAY_EXPORT_ENV,
    lake_query,
    ray_state_tasks,
    run_workload,
)
from tests.raylocal import local_ray
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


class DelayingProxy:
    """Forwards POSTs to `target`; `hold_next(s)` makes the next request wait s seconds."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.bodies: list[str] = []  # sha256 of every body, in arrival order
        self.in_flight = 0
        self._holds: list[float] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with proxy._lock:
                    proxy.bodies.append(hashlib.sha256(body).hexdigest())
                    hold = proxy._holds.pop(0) if proxy._holds else 0.0
                    proxy.in_flight += 1
                time.sleep(hold)
                status, answer = proxy.forward(body)
                with proxy._lock:
                    proxy.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # Ray gave up on this request already

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/ray/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def forward(self, body: bytes) -> tuple[int, bytes]:
        request = urllib.request.Request(self.target, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError as exc:
            return 502, str(exc).encode()

    def hold_next(self, seconds: float) -> None:
        with self._lock:
            self._holds.append(seconds)

    def resent(self) -> int:
        with self._lock:
            return len(self.bodies) - len(set(self.bodies))

    def start(self) -> DelayingProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Rig:
    agent: AgentProcess
    proxy: DelayingProxy
    job_id: str


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    agent = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    proxy = DelayingProxy(f"{agent.http_url}/ray/events").start()
    env = {**RAY_EXPORT_ENV, "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR": proxy.url}
    try:
        with local_ray(env) as job_id:
            yield Rig(agent, proxy, job_id)
    finally:
        proxy.stop()
        agent.stop()


def test_tasks_view_matches_ray_state_api(rig: Rig, tmp_path: Path) -> None:
    workload = run_workload(str(tmp_path))
    ray_tasks = ray_state_tasks(rig.job_id, workload["attempts"])

    def ours() -> dict[tuple[str, int], dict[str, Any]] | None:
        rows = lake_query(rig.agent, f"SELECT * FROM tasks WHERE job_id = '{rig.job_id}' "
                                     "AND coalesce(task_type, '') <> 'DRIVER_TASK' "
                                     f"AND coalesce(name, '') <> '{OTHER_TESTS_TASK}'")
        found = {(r["task_id"], r["attempt"]): r for r in rows}
        # The executor's RUNNING event comes in its own POST, and may come after the
        # owner's FINISHED: wait for it too.
        complete = set(found) == set(ray_tasks) and all(
            found[key]["final_state"] == ray_tasks[key].state and found[key]["name"]
            and (found[key]["pid"] or not ray_tasks[key].worker_pid)
            and (found[key]["final_state"] != "FINISHED" or found[key]["running_at"])
            for key in found)
        return found if complete else None

    tasks = wait_for(ours, 120, "the tasks view to match Ray's tasks", interval=0.5)
    for key, theirs in ray_tasks.items():
        mine = tasks[key]
        assert (mine["name"], mine["final_state"]) == (theirs.name, theirs.state), key
        assert mine["error_type"] == theirs.error_type, key
        if theirs.worker_pid:  # Ray's State API sometimes lacks it; our events carry it
            assert mine["pid"] == theirs.worker_pid, key
        for column in ("node_id", "worker_id", "parent_task_id"):
            if getattr(theirs, column):  # Ray leaves some unset (actor creation tasks)
                assert mine[column.replace("_task", "")] == getattr(theirs, column), (key, column)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in tasks.values():
        by_name.setdefault(row["name"], []).append(row)

    (boom,) = by_name["boom"]
    assert (boom["error_type"], boom["exception_class"], boom["error_message"]) == (
        "TASK_EXECUTION_EXCEPTION", "ValueError", "ValueError: intentional failure for x=7")
    assert "in boom" in boom["stack_trace"] and "\x1b" not in boom["stack_trace"]
    (fail,) = by_name["Counter.fail"]
    assert (fail["exception_class"], fail["error_message"]) == (
        "RuntimeError", "RuntimeError: actor method failure")
    assert "in fail" in fail["stack_trace"] and fail["actor_id"]
    flaky = {row["attempt"]: row for row in by_name["flaky"]}
    assert (flaky[0]["final_state"], flaky[0]["error_type"]) == ("FAILED", "WORKER_DIED")
    assert flaky[1]["final_state"] == "FINISHED" and flaky[1]["error_type"] is None
    nested = [r for r in by_name["square"] if r["parent_id"] == workload["outer_id"]]
    assert len(nested) == 2 and len(by_name["square"]) == 5
    finished = [r for r in tasks.values() if r["final_state"] == "FINISHED"]
    assert all(r["running_at"] is not None and r["duration_s"] >= 0 for r in finished)


def test_slow_answer_makes_ray_resend_but_stores_no_duplicates(rig: Rig) -> None:
    import ray

    @ray.remote
    def tick(i: int) -> int:  # named OTHER_TESTS_TASK
        return i

    resent_before = rig.proxy.resent()
    rig.proxy.hold_next(4.5)  # Ray gives up after 3 s and sends the same batch again
    refs = [tick.remote(i) for i in range(4)]
    task_ids = [ref.task_id().hex() for ref in refs]
    assert ray.get(refs) == [0, 1, 2, 3]
    wait_for(lambda: rig.proxy.resent() > resent_before, 30, "Ray to resend a batch")
    id_list = ", ".join(f"'{t}'" for t in task_ids)

    def landed() -> bool:
        rows = lake_query(rig.agent, "SELECT count(*) AS n FROM tasks WHERE running_at IS NOT"
                      f" NULL AND final_state = 'FINISHED' AND task_id IN ({id_list})")
        return bool(rows) and rows[0]["n"] == len(task_ids)

    wait_for(landed, 40, "the ticks to land after the resend")
    wait_for(lambda: rig.proxy.in_flight == 0, 30, "the held request to reach the agent")
    assert rig.agent.metric('evagg_duplicate_frames_total{route="ray"}') > 0

    def all_delivered() -> bool:
        received = rig.agent.metric("evagg_received_events_total")
        return rig.agent.metric("evagg_delivered_events_total") >= received

    wait_for(all_delivered, 30, "every stored event to reach the lake")
    duplicates = lake_query(rig.agent, "SELECT event_id, count(*) AS n FROM events_raw "
                                       "GROUP BY event_id HAVING count(*) > 1")
    assert duplicates == []
