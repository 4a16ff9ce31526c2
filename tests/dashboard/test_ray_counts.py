"""Counting what Ray counts and naming failures by their exception, as a user meets it:
Ray 2.60's export POSTed to a real agent, then the `evagg query` command (its exit code
and its words) and the dashboard in Chromium at 1280 and 1920 px, sizes measured.

The job: a driver that runs 60 s (Ray's own summary leaves its driver task out), five
`square`s of 1-5 s, a `flaky` task Ray ran twice, three failures Ray types alike
(TASK_EXECUTION_EXCEPTION: ValueError, KeyError, ZeroDivisionError), an actor's creation
task and a task cancelled before it ran (no duration).
"""

from __future__ import annotations

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
from tests.dashboard.ray_export import ACTOR, DRIVER, NIL_ACTOR, attempt
from tests.dashboard.serve import serving

COUNTED = 12  # attempts Ray counts: 5 square, 2 flaky, 3 failures, 1 creation, 1 cancelled
FAILURES = {"boom": "ValueError", "lookup": "KeyError", "divide": "ZeroDivisionError"}
WIDTHS = (1280, 1920)


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
    (driver,) = [r for r in rows if r[0] == "driver"]
    # the job at its Ray session: every cluster numbers its jobs from 01000000
    assert driver[1].startswith("01000000@session_") and driver[2:4] == ["1", "1"], driver
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
