"""Counting what Ray counts and naming failures by their exception, as a user meets it:
Ray 2.60's export POSTed to a real agent, then the `evagg query` command (its exit code
and its words) and the dashboard in Chromium at 1280 and 1920 px, sizes measured.

The job: a driver that runs 60 s (Ray's own summary leaves its driver task out), five
`square`s of 1-5 s, a `flaky` task Ray ran twice, three failures Ray types alike
(TASK_EXECUTION_EXCEPTION: ValueError, KeyError, ZeroDivisionError), an actor's creation
task and a task cancelled before it ran (no duration).
"""

from __future__ import annotations

import base64
import itertools
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving

SESSION = "session_2026-11-29_12-05-18_302995_6318"
JOB = bytes.fromhex("01000000")
NIL_ACTOR = b"\xff" * 12 + JOB
DRIVER = b"\xff" * 8 + NIL_ACTOR  # Ray's driver task id: ff..ff01000000
ACTOR = bytes.fromhex("a5bb2facdd9ef499094add58") + JOB
NODE = bytes.fromhex("f480837016fe4d56882c2f517adf7db93ed5e2a1684bbee867f7e8ca")
COUNTED = 12  # attempts Ray counts: 5 square, 2 flaky, 3 failures, 1 creation, 1 cancelled
FAILURES = {"boom": "ValueError", "lookup": "KeyError", "divide": "ZeroDivisionError"}
WIDTHS = (1280, 1920)
_ids = itertools.count(1)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def at(seconds: float) -> str:
    whole, frac = divmod(round(seconds * 1e9), 10**9)
    return f"2026-11-29T12:{5 + whole // 60:02d}:{whole % 60:02d}.{frac:09d}Z"


def envelope(event_type: str, key: str, payload: dict[str, Any], time: str) -> dict[str, Any]:
    return {"eventId": b64(next(_ids).to_bytes(20, "big")), "sourceType": "CORE_WORKER",
            "eventType": event_type, "timestamp": time, "severity": "INFO",
            "sessionName": SESSION, key: payload, "nodeId": b64(NODE), "message": ""}


def attempt(task_id: bytes, name: str, *, task_type: str = "NORMAL_TASK", number: int = 0,
            start: float, run_s: float | None, end: str = "FINISHED",
            error: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """One attempt as Ray exports it: the definition, the owner's lifecycle and the
    executor's RUNNING."""
    ids = {"taskId": b64(task_id), "taskAttempt": number, "jobId": b64(JOB)}
    definition = {**ids, "taskType": task_type, "taskName": name, "language": "PYTHON",
                  "taskFunc": {"pythonFunctionDescriptor": {
                      "moduleName": "job", "className": "", "functionName": name or "",
                      "functionHash": ""}},
                  "requiredResources": {"CPU": 1.0}, "parentTaskId": b64(DRIVER),
                  "placementGroupId": b64(b"\xff" * 18), "serializedRuntimeEnv": "{}"}
    events = [envelope("TASK_DEFINITION_EVENT", "taskDefinitionEvent", definition, at(start))]
    owner = [{"state": "PENDING_ARGS_AVAIL", "timestamp": at(start)}]
    if run_s is None:  # ended before it ran: no duration
        owner.append({"state": end, "timestamp": at(start + 0.5)})
        ended: dict[str, Any] = {**ids, "stateTransitions": owner}
        if error:
            ended["rayErrorInfo"] = {"errorType": error[0], "errorMessage": error[1]}
        return [*events, envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", ended,
                                  at(start + 0.5))]
    worker = b64(next(_ids).to_bytes(28, "big"))
    owner.append({"state": end, "timestamp": at(start + 0.1 + run_s)})
    done: dict[str, Any] = {**ids, "stateTransitions": owner, "nodeId": b64(NODE),
                            "workerId": worker, "workerPid": 0}
    if error:
        done["rayErrorInfo"] = {"errorType": error[0], "errorMessage": error[1]}
    running = {**ids, "stateTransitions": [{"state": "RUNNING", "timestamp": at(start + 0.1)}],
               "workerPid": 6000 + next(_ids), "nodeId": "", "workerId": ""}
    return [*events, envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", running,
                              at(start + 0.1)),
            envelope("TASK_LIFECYCLE_EVENT", "taskLifecycleEvent", done, at(start + run_s))]


def traceback(name: str, exception: str) -> str:
    return (f"User exception:\nray::{name}() (pid=6525, ip=192.0.2.2)\n"
            f'  File "/home/user/job/job.py", line 13, in {name}\n    raise {exception}("x")\n'
            f"{exception}: {name} failed on shard 7 of the nightly export")


def task_id(n: int) -> bytes:
    return n.to_bytes(8, "big") + NIL_ACTOR


def ray_job() -> list[dict[str, Any]]:
    events = attempt(DRIVER, "", task_type="DRIVER_TASK", start=0.0, run_s=60.0)
    for i in range(1, 6):
        events += attempt(task_id(i), "square", start=float(i), run_s=float(i))
    events += attempt(task_id(10), "flaky", start=10.0, run_s=0.5, end="FAILED",
                      error=("WORKER_DIED", "The worker died unexpectedly."))
    events += attempt(task_id(10), "flaky", number=1, start=12.0, run_s=0.5)
    for n, (name, exception) in enumerate(FAILURES.items(), start=20):
        events += attempt(task_id(n), name, start=float(n), run_s=0.25, end="FAILED",
                          error=("TASK_EXECUTION_EXCEPTION", traceback(name, exception)))
    events += attempt(b"\xff" * 8 + ACTOR, "Counter.__init__", task_type="ACTOR_CREATION_TASK",
                      start=30.0, run_s=0.3)
    events += attempt(task_id(40), "cancelled", start=40.0, run_s=None, end="FAILED",
                      error=("TASK_CANCELLED", "This task was cancelled before it ran."))
    return events


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The job's export as a real agent stored it."""
    agent = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    try:
        body = json.dumps(ray_job()).encode()
        request = urllib.request.Request(f"{agent.http_url}/ray/events", data=body,
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200 and json.loads(answer.read())["rejected"] == 0
        assert agent.stop() == 0  # drains what it took to Parquet
        yield agent.lake_dir
    finally:
        if agent.running:
            agent.kill()


def summary_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()[2:-1]]


@pytest.mark.parametrize("cache", ["--no-cache", "cache"])
def test_summary_counts_what_ray_counts_and_says_attempts(lake: Path, tmp_path: Path,
                                                          cache: str) -> None:
    flags = ["--no-cache"] if cache == "--no-cache" else ["--cache", str(tmp_path / "cache")]
    done = evagg("query", "--data", str(lake), *flags, "summary")
    assert done.returncode == 0, done.stderr
    rows = summary_rows(done.stdout)
    assert ["all", str(COUNTED)] == rows[0][:2], done.stdout  # not 13: the driver is apart
    assert ["driver", "01000000", "1", "1"] in [r[:4] for r in rows], done.stdout
    assert ["name", "flaky", "2"] in [r[:3] for r in rows]  # two attempts of one task
    assert "tasks counts task attempts" in done.stderr and "(a retry) counts 2" in done.stderr
    assert "Ray's driver tasks (1) are counted only in the driver rows" in done.stderr
    as_json = json.loads(evagg("query", "--data", str(lake), *flags, "summary", "--json").stdout)
    everything = next(r for r in as_json if r["dimension"] == "all")
    assert everything["max_s"] == 5.0  # the 60 s driver is not the job's longest task
    job = next(r for r in as_json if r["dimension"] == "job")
    assert (job["tasks"], job["max_s"]) == (COUNTED, 5.0)


def test_failures_are_named_by_their_exception(lake: Path) -> None:
    done = evagg("query", "--data", str(lake), "--no-cache", "summary", "--json")
    assert done.returncode == 0, done.stderr
    errors = {r["value"]: r["failed"] for r in json.loads(done.stdout)
              if r["dimension"] == "error_type"}
    assert errors == {"ValueError": 1, "KeyError": 1, "ZeroDivisionError": 1, "WORKER_DIED": 1,
                      "TASK_CANCELLED": 1}
    table = evagg("query", "--data", str(lake), "--no-cache", "summary").stdout
    assert "TASK_EXECUTION_EXCEPTION" not in table


@pytest.mark.parametrize("asked, names", [
    ("ValueError", ["boom"]),
    ("TASK_EXECUTION_EXCEPTION", ["boom", "divide", "lookup"]),  # Ray's type still finds them
])
def test_the_error_filter_takes_the_class_or_ray_s_type(lake: Path, asked: str,
                                                        names: list[str]) -> None:
    done = evagg("query", "--data", str(lake), "--no-cache", "tasks", "--error-type", asked,
                 "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert sorted(r["name"] for r in rows) == names
    assert {(r["error_type"], r["exception_class"]) for r in rows} == {
        ("TASK_EXECUTION_EXCEPTION", FAILURES[n]) for n in names}


def test_the_driver_and_the_actor_creation_task_are_in_the_task_list(lake: Path) -> None:
    done = evagg("query", "--data", str(lake), "--no-cache", "tasks", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert len(rows) == COUNTED + 1
    (driver,) = [r for r in rows if r["task_type"] == "DRIVER_TASK"]
    assert driver["task_id"] == DRIVER.hex() and driver["duration_s"] == 60.0
    (creation,) = [r for r in rows if r["task_type"] == "ACTOR_CREATION_TASK"]
    assert creation["actor_id"] == ACTOR.hex()  # Ray's definition does not name it


# ---- the dashboard ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def page(request: pytest.FixtureRequest, browser: Any, lake: Path) -> Iterator[Page]:
    store = Store(StoreOptions(str(lake), refresh_s=0.2))
    with serving(store) as url, tab(browser, url, width=request.param, height=900) as opened:
        yield opened


def shot(page: Page, name: str) -> None:
    width = page.viewport_size["width"] if page.viewport_size else 0
    page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)


def test_the_overview_counts_as_ray_and_says_where_the_driver_is(page: Page) -> None:
    page.goto("/#/")
    tasks = page.locator(".card", has_text="Tasks").first
    expect(tasks.locator(".card-value")).to_have_text(str(COUNTED))
    expect(tasks.locator(".drivers-note")).to_contain_text("1 Ray driver not counted")
    failures = page.locator("section", has_text="Failures by error").locator("tbody tr")
    expect(failures).to_have_count(5)
    shot(page, "ray-counts-overview")
    names = failures.locator("td[data-col=value]").all_inner_texts()
    assert sorted(names) == ["KeyError", "TASK_CANCELLED", "ValueError", "WORKER_DIED",
                             "ZeroDivisionError"]


def test_the_task_table_shows_the_exception_class_uncut(page: Page) -> None:
    page.goto("/#/tasks?sort=name&order=asc")
    expect(page.locator("table.grid.tasks")).to_be_visible()
    shot(page, "ray-counts-tasks")
    for name, exception in FAILURES.items():
        cell = page.locator("table.grid.tasks tbody tr", has_text=name).locator(
            "td[data-col=error_type]")
        text = cell.locator("span.error-text")
        expect(text).to_contain_text(f"{exception}: {name} failed")
        title = text.get_attribute("title") or ""  # Ray's type stays in the tooltip
        assert title.startswith(f"TASK_EXECUTION_EXCEPTION: {exception}: {name}"), title
        # The class's own letters lie inside the cell, not behind its ellipsis.
        right, edge = text.evaluate("""(span, n) => {
            const range = document.createRange();
            range.setStart(span.firstChild, 0);
            range.setEnd(span.firstChild, n);
            return [range.getBoundingClientRect().right,
                    span.closest('td').getBoundingClientRect().right];
        }""", len(exception))
        assert right <= edge, (name, right, edge)


def test_a_group_without_durations_says_so(page: Page) -> None:
    page.goto("/#/groups?by=name")
    row = page.locator("table.grid tbody tr", has_text="cancelled")
    word = row.locator(".no-durations")
    expect(word).to_have_text("no durations: none of these reported a start and an end")
    # measured in one step: a refresh may draw the page again between two calls
    width = word.evaluate("el => el.getBoundingClientRect().width")
    assert width > 0
    assert row.locator("svg.histogram").count() == 0  # no empty frame
    square = page.locator("table.grid tbody tr", has_text="square").locator("svg.histogram")
    expect(square).to_be_visible()  # a group with durations keeps its histogram
