"""The dashboard in real headless Chromium: clicks, filters, search, trace, training run.

Screenshots of every page go to test-artifacts/dashboard/ at the repository root.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.lakegen import (
    TRACE,
    Expected,
    at,
    event,
    local_put,
    task_events,
    write_rows,
)
from tests.dashboard.serve import serving

INJECTIONS = ["'; DROP VIEW events; --", "%' OR 1=1 --"]


@pytest.fixture
def site(lake: Path) -> Iterator[str]:
    store = Store(StoreOptions(str(lake), refresh_s=0.2))
    with serving(store) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module; each test has a tab (a browser context) of its own."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, site: str) -> Iterator[Page]:
    with tab(browser, site, width=1400, height=900) as opened:
        yield opened


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def task_ids(page: Page) -> list[str]:
    return sorted(page.locator("table.grid tbody tr td:first-child a").all_inner_texts())


def test_overview_error_count_filters_the_task_table(page: Page) -> None:
    page.goto("/")
    expect(page.locator(".state-chip[data-state=FINISHED]")).to_contain_text("11")
    expect(page.locator("svg.timeline rect").first).to_be_visible()
    shot(page, "overview")
    row = page.locator("table.grid tr", has_text="ValueError")
    row.locator("a.count-link").last.click()  # the FAILED count of ValueError
    expect(page.locator("#task-count")).to_have_text("2 task attempts")
    assert "error_type=ValueError" in page.url and "state=FAILED" in page.url
    assert task_ids(page) == ["boom1", "boom2"]
    expect(page.locator(".chip[data-filter=error_type]")).to_contain_text("ValueError")
    shot(page, "tasks-filtered-by-error")
    page.locator(".chip[data-filter=error_type] a").click()  # remove one filter
    expect(page.locator("#task-count")).to_have_text("4 task attempts")
    page.goto("/")  # the Failed card's foot says where it leads, not its number again
    page.get_by_role("link", name="failed tasks", exact=True).click()
    expect(page.locator("#task-count")).to_have_text("4 task attempts")
    assert page.url.endswith("#/tasks?state=FAILED")


def test_search_stack_trace_and_task_detail(page: Page) -> None:
    page.goto("/#/tasks")
    expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks} task attempts")
    page.fill("input[name=q]", "ENOSPC")  # only in flaky attempt 0's stack trace
    page.click("form.search button")
    expect(page.locator("#task-count")).to_have_text("1 task attempt")
    shot(page, "tasks-search")
    page.click("table.grid tbody a:text('flaky')")
    expect(page.locator("pre.stack")).to_contain_text("write failed ENOSPC")
    expect(page.locator("svg.state-timeline circle")).to_have_count(4)
    shot(page, "task-detail")


def test_the_search_box_finds_a_failed_op_and_span_too(page: Page) -> None:
    """A training step's error and a span's are no task's: the one search box of the
    dashboard lists them under the tasks it matched, each linked to its run or trace."""
    page.goto("/#/tasks")
    page.fill("input[name=q]", "misaligned")  # a failed backward op of run1
    page.click("form.search button")
    expect(page.locator("#task-count")).to_have_text("0 task attempts")
    others = page.locator("table.other-matches tbody tr")
    expect(others).to_have_count(1)
    expect(others).to_contain_text("backward")
    expect(others).to_contain_text("RuntimeError: CUDA error: misaligned address")
    shot(page, "tasks-search-ops")
    others.locator("a", has_text="run run1").click()
    expect(page.locator("h1")).to_have_text("Run run1")
    page.goto("/#/tasks?q=missing%20variable")  # the failed span of the sample trace
    link = page.locator("table.other-matches a", has_text=TRACE)
    expect(link).to_have_count(1)
    link.click()
    expect(page.locator("svg.waterfall g.span-row")).to_have_count(4)
    page.goto("/#/tasks?q=ENOSPC")  # a task's stack trace only: no second table
    expect(page.locator("#task-count")).to_have_text("1 task attempt")
    expect(page.locator("table.other-matches")).to_have_count(0)


def test_injection_strings_find_nothing_and_views_survive(page: Page, site: str) -> None:
    for text in INJECTIONS:
        page.goto("/#/tasks")
        expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks} task attempts")
        page.fill("input[name=q]", text)
        page.click("form.search button")
        expect(page.locator("#task-count")).to_have_text("0 task attempts")
        expect(page.locator(".chip[data-filter=q]")).to_contain_text(text)
    shot(page, "tasks-injection")
    page.goto("/")
    expect(page.locator(".state-chip[data-state=FAILED]")).to_contain_text("4")
    page.goto("/#/tasks")
    expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks} task attempts")


def test_trace_waterfall(page: Page) -> None:
    page.goto("/#/traces")
    page.click(f"a:text('{TRACE}')")
    rows = page.locator("svg.waterfall g.span-row")
    expect(rows).to_have_count(4)
    names = rows.locator("text.span-name").all_text_contents()
    assert names == ["request", "db.query", "render", "template"]  # depth-first
    expect(page.locator(".trace-when")).to_contain_text("started ")
    expect(page.locator(".trace-when")).to_contain_text("services: api")
    expect(page.locator("svg.waterfall g.failed")).to_have_count(1)
    page.locator("svg.waterfall g.failed").click()
    detail = page.locator(".span-detail")
    expect(detail).to_contain_text("missing variable 'user'")
    expect(detail.locator("pre.stack")).to_contain_text('File "page.py", line 9, in render')
    detail.get_by_text("attributes (2)").click()
    expect(detail.locator("dl.attrs")).to_contain_text("otel.span_kind")
    shot(page, "trace-waterfall")
    rows.nth(0).click()  # a span without a stack trace: its detail read "null" above them
    expect(detail.locator("dd").first).to_have_text("request")
    assert "null" not in detail.inner_text(), detail.inner_text()


def test_training_run_view(page: Page) -> None:
    page.goto("/#/runs")
    page.click("a:text('run1')")
    expect(page.locator("table.steps tbody tr")).to_have_count(3)
    expect(page.locator("svg.metric")).to_have_count(3)  # the steps' wall time, grad_norm, loss
    last = page.locator("table.steps tbody tr[data-step='2']")
    expect(last).to_contain_text("5 ops")
    last.locator("summary").click()
    expect(last.locator("li", has_text="save")).to_contain_text("own step: none")
    shot(page, "training-run")


def test_groups_and_agents_pages(page: Page) -> None:
    page.goto("/#/groups?by=name")
    expect(page.locator("table.grid tbody tr")).to_have_count(5)
    expect(page.locator("svg.histogram").first).to_be_visible()
    shot(page, "groups-by-name")
    page.goto("/#/agents")
    expect(page.locator("table.grid").first).to_contain_text("nodeA")
    shot(page, "agents")


def test_the_counts_of_a_none_group_lead_to_its_tasks(page: Page, lake: Path) -> None:
    rows = task_events("nojob1", "orphan", start=65.0, run_s=1.0, end_state="FINISHED")
    for row in rows:
        row["job_id"] = None
    write_rows(local_put(lake), rows, "part-00012.parquet")
    page.goto("/#/groups?by=job")
    none_row = page.locator("table.grid tbody tr", has_text="(no job id)")
    expect(none_row).to_have_count(1)
    job1 = page.locator("table.grid tbody tr", has_text="job1")
    expect(job1.locator("a.count-link").first).to_have_attribute("href", "#/tasks?job=job1")
    none_row.locator("a.count-link").first.click()  # its tasks: those without a job id
    expect(page.locator(".chip[data-filter=job]")).to_contain_text("(none)")
    expect(page.locator("table.grid tbody tr")).to_have_count(1)
    expect(page.locator("table.grid tbody tr")).to_contain_text("orphan")


def test_a_failure_without_an_error_type_is_among_the_failures_by_error(
        page: Page, lake: Path) -> None:
    write_rows(local_put(lake), task_events("mute1", "mute", start=66.0, run_s=1.0,
                                            end_state="FAILED"), "part-00014.parquet")
    page.goto("/")
    expect(page.locator(".state-chip[data-state=FAILED]")).to_contain_text("5")
    section = page.locator("section", has_text="Failures by error")
    mute = section.locator("table.grid tbody tr", has_text="(no error type)")
    expect(mute).to_have_count(1)
    expect(mute.locator("a.count-link").first).to_have_text("1")
    counts = section.locator("table.grid tbody tr td:nth-child(2)").all_inner_texts()
    assert sum(int(n) for n in counts) == 5  # the error rows add up to the failures
    # the error groups hold failures only: no columns of states none of them is in
    heads = section.locator("table.grid thead th").all_inner_texts()
    assert "failed" in heads and not {"pending", "submitted", "running", "finished"} & set(heads)
    mute.locator("a.count-link").first.click()  # the failure itself, not every task
    expect(page.locator("table.grid tbody tr")).to_have_count(1)
    expect(page.locator("table.grid tbody tr")).to_contain_text("mute")


def test_a_group_s_states_add_up_to_its_tasks(page: Page, lake: Path) -> None:
    # a producer's own state (DONE) is no column of the five: it gets an "other" column
    rows = [event(kind="task", source="script", task_id="odd1", attempt=0, name="odd",
                  state="DONE", time=at(67.0))]
    write_rows(local_put(lake), rows, "part-00015.parquet")
    page.goto("/#/groups?by=name")
    odd = page.locator("table.grid tbody tr", has_text="odd")
    expect(odd.locator("td[data-col=other]")).to_have_text("1")
    heads = page.locator("table.grid thead th").all_inner_texts()
    assert "other" in heads
    square = page.locator("table.grid tbody tr", has_text="square")
    expect(square.locator("td[data-col=other]")).to_have_text("0")


def test_each_ray_cluster_s_job_is_a_group_of_its_own(page: Page, lake: Path) -> None:
    # Every Ray cluster numbers its jobs from 01000000: two clusters' first jobs are two
    # groups, and each group's link opens that cluster's tasks alone.
    sessions = ["session_2026-12-06_23-37-21_553190_1060",
                "session_2026-12-06_23-38-48_891950_2941"]
    rows = []
    for n, session in enumerate([sessions[0], sessions[0], sessions[1]]):
        for row in task_events(f"c{n}", "tiny", start=70.0 + n, run_s=0.5,
                               end_state="FINISHED", job="01000000"):
            row["attrs"] = {**row["attrs"], "ray_session": session}
            rows.append(row)
    write_rows(local_put(lake), rows, "part-00013.parquet")
    page.goto("/#/groups?by=job")
    expect(page.locator("table.grid tbody tr", has_text="01000000")).to_have_count(2)
    first = page.locator("table.grid tbody tr", has_text=sessions[0])
    expect(first.locator(".group-session")).to_have_text(sessions[0])  # a line of its own
    # ... and whole: two clusters started the same minute differ at its end
    assert first.locator(".group-session").evaluate("e => e.scrollWidth <= e.clientWidth")
    expect(first.locator("a.count-link").first).to_have_text("2")
    # the job's Ray timeline is a click away
    timeline = first.locator("a.group-timeline")
    expect(timeline).to_have_attribute("href",
                                       f"#/timeline?job=01000000&session={sessions[0]}")
    first.locator("a.count-link").first.click()
    expect(page.locator("#task-count")).to_have_text("2 task attempts")
    assert task_ids(page) == ["c0", "c1"]


def test_a_task_id_two_ray_clusters_reused_opens_each_cluster_s_attempt(
        page: Page, lake: Path) -> None:
    # Ray's clusters number jobs, and so task ids, alike: each row's link keeps to its
    # cluster, the session filter keeps one cluster's rows, the bare id shows both
    sessions = ["session_2026-12-06_10-00-00_000001_1", "session_2026-12-06_11-00-00_000002_2"]
    rows = []
    for n, (session, name) in enumerate(zip(sessions, ["square", "second_boom"], strict=True)):
        for row in task_events("reused01000000", name, start=80.0 + n, run_s=0.5,
                               end_state="FINISHED", job="01000000"):
            row["attrs"] = {**row["attrs"], "ray_session": session}
            rows.append(row)
    write_rows(local_put(lake), rows, "part-00016.parquet")
    page.goto(f"/#/tasks?session={sessions[1]}")
    expect(page.locator("#task-count")).to_have_text("1 task attempt")
    page.locator("table.grid tbody tr td:first-child a").click()
    assert f"session={sessions[1]}" in page.url
    expect(page.locator(".attempt > h2")).to_have_count(1)
    expect(page.locator(".attempt > h2")).to_have_text("second_boom — attempt 0")
    page.goto("/#/task?task_id=reused01000000")  # an id alone: both, each named
    expect(page.locator(".attempt > h2")).to_have_count(2)
    expect(page.locator(".attempt > h2").first).to_contain_text(f"(Ray session {sessions[0]})")


def test_auto_refresh_shows_new_files_and_escapes_text(page: Page, lake: Path) -> None:
    page.goto("/#/tasks")
    expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks} task attempts")
    files = page.request.get("/api/info").json()["files"]  # what the store lists
    expect(page.locator("#store-info")).to_contain_text(f" · {files} files · ")
    hostile = "<img src=x onerror=alert(1)>"
    write_rows(local_put(lake), task_events("new1", hostile, start=60.0, run_s=1.0,
                                            end_state="FINISHED"), "part-00010.parquet")
    expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks + 1} task attempts",
                                                     timeout=30_000)
    more = page.request.get("/api/info").json()["files"]
    assert more > files
    expect(page.locator("#store-info")).to_contain_text(f" · {more} files · ")
    expect(page.locator("table.grid tbody td", has_text=hostile)).to_have_count(1)
    expect(page.locator("table.grid img")).to_have_count(0)


def rerendered_after_new_file(page: Page, lake: Path, name: str) -> None:
    """Write a file into the lake and wait until auto-refresh has drawn the page again."""
    page.evaluate("document.querySelector('#page > *').dataset.before = 'yes'")
    write_rows(local_put(lake), task_events(name, name, start=61.0, run_s=1.0,
                                            end_state="FINISHED"), f"part-{name}.parquet")
    expect(page.locator("#page > [data-before]")).to_have_count(0, timeout=30_000)


def test_an_auto_refresh_keeps_what_the_reader_is_in_the_middle_of(
        page: Page, lake: Path) -> None:
    """A new file comes every heartbeat: it must not wipe a half-typed search, a step's
    opened ops or the span being read."""
    page.goto("/#/tasks")
    expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks} task attempts")
    search = page.locator("form.search input[name=q]")
    search.click()
    search.type("boo")  # not submitted
    rerendered_after_new_file(page, lake, "refresh1")
    expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks + 1} task attempts")
    expect(search).to_have_value("boo")
    expect(search).to_be_focused()
    page.goto("/#/run?run=run1")
    page.locator("details[data-key=step-2] summary").click()
    rerendered_after_new_file(page, lake, "refresh2")
    expect(page.locator("details[data-key=step-2]")).to_have_attribute("open", "")
    page.goto(f"/#/trace?trace_id={TRACE}")
    page.locator("svg.waterfall g.failed").click()
    rerendered_after_new_file(page, lake, "refresh3")
    expect(page.locator(".span-detail")).to_contain_text("missing variable 'user'")


def test_a_page_takes_its_parameter_by_the_column_s_name_too(page: Page) -> None:
    """`run_id=` as the column is named, where the page's own word is `run=`: the run's
    page, not the page of the ops sent without a run id."""
    page.goto("/#/run?run_id=run1")
    expect(page.locator("h1")).to_have_text("Run run1")
    page.goto(f"/#/trace?trace={TRACE}")
    expect(page.locator("svg.waterfall g.failed")).to_have_count(1)


def test_errors_show_as_messages(page: Page) -> None:
    page.goto("/#/task?task_id=nope")
    expect(page.locator(".error-box")).to_contain_text("no task 'nope'")
    page.goto("/#/tasks?since=yesterday")
    expect(page.locator(".error-box")).to_contain_text("cannot read time")


def test_a_failed_run_names_its_failed_steps_at_its_top(browser: Any, site: str) -> None:
    """A failed step was a red row under the charts and every step before it: the run's
    top says which step failed and with what, a click away from the row."""
    with tab(browser, site, width=1280, height=500) as page:
        page.goto("/#/run?run=run1")
        failures = page.locator("#run-failures")
        expect(failures).to_contain_text("1 failed step: step 2 backward: RuntimeError: "
                                         "CUDA error: misaligned address")
        expect(failures).to_be_in_viewport()
        row = page.locator("table.steps tbody tr[data-step='2']")
        expect(row).not_to_be_in_viewport(ratio=1)
        assert page.evaluate("window.scrollY") == 0
        failures.locator("button.step-link").click()
        expect(row).to_be_in_viewport(ratio=1)
        assert page.evaluate("window.scrollY") > 0
        page.goto("/#/run?run=run2")  # no failure: nothing said
        expect(page.locator("table.steps tbody tr")).to_have_count(1)
        expect(page.locator("#run-failures")).to_have_count(0)
