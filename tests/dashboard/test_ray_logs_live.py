"""Real Ray 2.60: what Ray's dashboard answers for each task, attempt, actor and stream
while the cluster lives, evagg answers the same from the lake once Ray, its files and
the agent are gone."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO, query_lake
from tests.dashboard.raylogclient import get_logs
from tests.dashboard.serve import serving
from tests.rayhead import EXPORT_ENV, ray_head_and_agent
from tests.waiting import wait_until


@dataclass
class Recorded:
    lake: Path
    asks: list[dict[str, Any]] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # what -> task or actor id


def workload(marker: str) -> dict[str, str]:
    """Tasks printing known lines (unicode, 2,000 lines), one raising, one retried whose
    attempts print their number, an actor printing in its constructor and a method."""
    import os

    import ray

    @ray.remote
    def hello(n: int) -> int:
        print(f"hello stdout {n} ✓ ünïcødé")
        print(f"hello stderr {n}", file=sys.stderr)
        return n

    @ray.remote
    def chatty() -> None:
        for i in range(2000):
            print(f"chatty line {i}")

    @ray.remote(max_retries=0)
    def boom() -> None:
        print("about to fail")
        raise ValueError("boom at the end")

    @ray.remote(max_retries=1, retry_exceptions=True)
    def flaky(path: str) -> str:
        attempt = 1 if os.path.exists(path) else 0
        print(f"flaky attempt {attempt}")
        print(f"flaky attempt {attempt} on stderr", file=sys.stderr)
        if attempt == 0:
            open(path, "w").close()
            raise RuntimeError("the first attempt fails")
        return "ok"

    @ray.remote
    class Counter:
        def __init__(self) -> None:
            print("Counter constructed")

        def incr(self) -> int:
            print("Counter.incr called")
            return 1

    refs: dict[str, Any] = {"hello": hello.remote(1), "chatty": chatty.remote(),
                            "flaky": flaky.remote(marker)}
    ray.get([refs["hello"], refs["chatty"], refs["flaky"]])
    failing = boom.remote()
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(failing)
    counter = Counter.remote()  # type: ignore[attr-defined]
    ray.get(counter.incr.remote())
    ids = {name: ref.task_id().hex() for name, ref in refs.items()}
    ids["boom"] = failing.task_id().hex()
    ids["actor"] = counter._actor_id.hex()
    return ids


def questions(ids: dict[str, str]) -> list[dict[str, Any]]:
    asks: list[dict[str, Any]] = []
    for name in ("hello", "chatty", "boom"):
        for suffix in ("out", "err"):
            asks.append({"task_id": ids[name], "suffix": suffix})
    asks.append({"task_id": ids["chatty"], "tail": 1000})  # Ray's default tail
    for attempt in (0, 1):
        for suffix in ("out", "err"):
            asks.append({"task_id": ids["flaky"], "attempt_number": attempt, "suffix": suffix})
    for suffix in ("out", "err"):
        asks.append({"actor_id": ids["actor"], "suffix": suffix})
    return asks


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    import ray

    work = tmp_path_factory.mktemp("raylive")
    agent_dir = work / "agent"
    agent_dir.mkdir()
    with ray_head_and_agent(agent_dir) as (agent, head), driver_env(EXPORT_ENV):
        ray.init(address=head.address, log_to_driver=False)  # the owner exports too
        try:
            ids = workload(str(work / "flaky-marker"))
            asks = questions(ids)
            answers = wait_for_ray_answers(head.dashboard_url, asks)
            # The GCS exports the actor's worker on its own schedule: a shutdown before
            # that export loses it for good, and the wait below timed out on busy runs.
            wait_until(lambda: actor_exported(agent.lake_dir, ids["actor"]), 120,
                       "the GCS's export of the actor's worker in the lake")
        finally:
            ray.shutdown()
    try:  # Ray is gone; its files are still on the node until the agent has stopped
        wait_until(lambda: shipped_all(agent.lake_dir, ids), 120,
                   lambda: f"every task's log info in the lake: {ids}, have "
                           f"{log_infos(agent.lake_dir)}")
        assert agent.stop() == 0  # its last shipping has what the workers printed last
    finally:
        agent.kill()
        shutil.rmtree(head.temp_dir)
    yield Recorded(agent.lake_dir, asks, answers, ids)


@contextlib.contextmanager
def driver_env(env: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wait_for_ray_answers(url: str, asks: list[dict[str, Any]]) -> list[Any]:
    """Ray's answers once its task table has every attempt's log info (Ray's own
    dashboard answers a running task's log with what it printed so far)."""
    answers: list[Any] = []

    def complete() -> bool:
        answers[:] = get_logs(url, asks)
        return not any(isinstance(a, dict) for a in answers)

    wait_until(complete, 180, lambda: f"Ray's answers, have {answers}", interval=2)
    return answers


def log_infos(lake: Path) -> list[tuple[Any, ...]]:
    if not any(lake.rglob("*.parquet")):
        return []
    return query_lake(lake, "SELECT task_id, attempt, count(*) FROM events WHERE kind = 'task' "
                            "AND attrs['ray_task_log_info'] IS NOT NULL GROUP BY ALL")


def shipped_all(lake: Path, ids: dict[str, str]) -> bool:
    """Every attempt's log info and its owner's end are in the lake."""
    tasks = [ids[name] for name in ("hello", "chatty", "boom", "flaky")]
    ended = {(t, a) for t, a in query_lake(lake, "SELECT task_id, attempt FROM events WHERE "
                                                 "kind = 'task' AND attrs['ray_state'] IN "
                                                 "('FINISHED', 'FAILED')")} if any(
        lake.rglob("*.parquet")) else set()
    enough = {(t, a) for t, a, _ in log_infos(lake)} & ended
    if not ended or not actor_exported(lake, ids["actor"]):
        return False
    return {(t, 0) for t in tasks} | {(ids["flaky"], 1)} <= enough


def actor_exported(lake: Path, actor_id: str) -> bool:
    """The GCS's export of the actor with its worker is in the lake."""
    if not any(lake.rglob("*.parquet")):
        return False
    found = query_lake(lake, "SELECT count(*) FROM events WHERE kind = 'actor' AND "
                             f"actor_id = '{actor_id}' AND worker_id <> ''")
    return bool(found and found[0][0])


def test_ray_s_client_reads_the_same_lines_from_evagg(recorded: Recorded) -> None:
    store = Store(StoreOptions(location=str(recorded.lake)))
    try:
        with serving(store) as url:
            ours = get_logs(url, recorded.asks)
    finally:
        store.close()
    for ask, theirs, mine in zip(recorded.asks, recorded.answers, ours, strict=True):
        assert mine == theirs, ask
    by_ask = dict(zip((str(a) for a in recorded.asks), recorded.answers, strict=True))
    flaky = recorded.names["flaky"]
    assert "flaky attempt 1" in by_ask[str({"task_id": flaky, "attempt_number": 1,
                                            "suffix": "out"})]
    chatty = by_ask[str({"task_id": recorded.names["chatty"], "tail": 1000})]
    assert chatty.count("chatty line") == 1000 and "chatty line 1999" in chatty


def test_evagg_query_logs_prints_what_ray_printed(recorded: Recorded) -> None:
    for ask, theirs in zip(recorded.asks, recorded.answers, strict=True):
        if "task_id" not in ask:
            continue
        flags = ["--task", ask["task_id"], "--attempt", str(ask.get("attempt_number", 0)),
                 "--tail", str(ask.get("tail", -1))]
        if ask.get("suffix") == "err":
            flags.append("--err")
        done = subprocess.run([sys.executable, "-m", "aggregator", "query", "logs", "--data",
                               str(recorded.lake), *flags], capture_output=True, cwd=REPO,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        text = done.stdout.decode()
        if ask.get("tail", -1) > 0:
            text = text.split("---\n\n", 1)[1]
        assert text == theirs, ask


def test_a_failed_task_leads_to_its_page_with_the_error_beside_its_output(
        recorded: Recorded) -> None:
    from playwright.sync_api import expect

    from tests.dashboard.chromium import ARTIFACTS, chromium, tab

    store = Store(StoreOptions(location=str(recorded.lake)))
    try:
        with serving(store) as url, chromium() as browser, \
                tab(browser, url, width=1400, height=2000) as page:
            page.goto("/#/tasks?state=FAILED&name=boom")
            page.locator("a.error-link").first.click()  # one click from the table
            expect(page.locator(".attempt p.error-text")).to_contain_text("boom at the end")
            expect(page.locator("pre.stack")).to_contain_text('raise ValueError("boom at')
            out = page.locator('pre.log[data-stream="out"]')
            expect(out).to_contain_text("about to fail")
            expect(page.locator(".task-logs")).to_contain_text("Nothing on stderr.")
            page.screenshot(path=str(ARTIFACTS / "ray-task-logs.png"), full_page=True)

            page.goto(f"/#/task?task_id={recorded.names['chatty']}&attempt=0")
            expect(page.locator(".log-note").first).to_contain_text("The last 200 lines")
            expect(page.locator('pre.log[data-stream="out"]')).to_contain_text("chatty line 1999")
            href = page.locator("a.log-all").first.get_attribute("href")
            assert href is not None
            whole = page.request.get(href).text()
            assert whole.count("chatty line") == 2000
    finally:
        store.close()
