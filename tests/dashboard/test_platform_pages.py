"""What a platform engineer meets on the dashboard, in real headless Chromium at 1280 and
1920 px, measured: the row of ops without a run id opens, Ray's traced ops are traces,
the Ray timeline fills the width with lanes named by ip and pid on the job's clock,
labels are whole and apart, and the Agents page shows a restart and a heartbeat gap;
and `evagg query agents` prints counts as integers.

Screenshots go to test-artifacts/dashboard/ (`platform-<check>-<width>.png`).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.lakegen import Row, at, event, local_put, write_rows, write_sample_store
from tests.dashboard.raygen import JOB, write_ray_lake
from tests.dashboard.serve import serving

REPO = Path(__file__).resolve().parents[2]
WIDTHS = (1280, 1920)
TRACE = "ab" * 16
# A page's first answer waits for DuckDB to read the store: on a loaded machine that is
# more than Playwright's 5 s default, so each check waits as long as the tab does.
expect.set_options(timeout=20_000)


def ray_ops() -> list[Row]:
    """A driver's ray_op "epoch" and three traced_remote calls under it, with no run id."""
    common = {"kind": "op", "source": "ray", "job_id": "02000000", "trace_id": TRACE}
    rows = [event(**common, name="epoch", span_id="e0", state="STARTED", time=at(700)),
            event(**common, name="epoch", span_id="e0", state="FINISHED", time=at(703),
                  duration_s=3.0)]
    for i in range(3):
        call = {**common, "name": "ray_job.work", "span_id": f"w{i}", "parent_span_id": "e0",
                "task_id": f"c{i}"}
        rows += [event(**call, state="STARTED", time=at(700.5 + i)),
                 event(**call, state="FINISHED", time=at(701 + i), duration_s=0.5)]
    return rows


def small_metrics() -> list[Row]:
    """A run whose loss is under a thousandth, whose learning rate never changes, and
    whose tokens_per_s runs in the millions."""
    return [event(kind="op", source="torch", run_id="tiny", step=step, name="train_step",
                  span_id=f"t{step}", state="FINISHED", time=at(800 + step), duration_s=0.1,
                  metrics={"loss": 0.000692 + step * 0.0001, "lr": 0.01,
                           "tokens_per_s": 3931860.6 - step * 1000})
            for step in range(4)]


def long_run() -> list[Row]:
    """A run of 600 steps whose step 10 failed."""
    return [event(kind="op", source="torch", run_id="long", step=step, name="train_step",
                  state="FAILED" if step == 10 else "FINISHED", time=at(2000.0 + step),
                  duration_s=0.5, metrics={"loss": 1.0}) for step in range(600)]


def restarted_agent() -> list[Row]:
    """nodeR: beats every 10 s, then 45 s of silence and a restart (its counters fall)."""
    def beat(t: float, count: float) -> Row:
        return event(kind="agent", source="evagg", name="heartbeat", state="RUNNING",
                     node_id="nodeR", time=at(t), attrs={"version": "0.1.0",
                                                          "heartbeat_interval_s": "10"},
                     metrics={'evagg_received_events_total{route="socket"}': count,
                              'evagg_delivered_events_total{sink="lake"}': count})
    return [beat(0, 2000.0), beat(10, 2159.0), beat(55, 3.0), beat(65, 50.0)]


def stopped_agent() -> list[Row]:
    """nodeS: an agent stopped cleanly (its final heartbeat says STOPPING)."""
    return [event(kind="agent", source="evagg", name="heartbeat", state=state, node_id="nodeS",
                  time=at(t), attrs={"heartbeat_interval_s": "10", "started_at": "s1"},
                  metrics={'evagg_received_events_total{route="socket"}': 5.0})
            for t, state in ((0, "RUNNING"), (10, "RUNNING"), (12, "STOPPING"))]


LONG_IDS = [f"demo-20261206-210838-task-{n}" for n in (206, 207)]


def long_ids() -> list[Row]:
    """Two tasks of one producer whose ids differ only at their end."""
    return [event(kind="task", source="emitter", name="long_ids", task_id=task_id, attempt=0,
                  state="FINISHED", time=at(950 + n))
            for n, task_id in enumerate(LONG_IDS)]


def ray_failures() -> list[Row]:
    """Ray failures whose message holds no traceback: grouped by Ray's own error type."""
    rows: list[Row] = []
    for i in range(3):
        task = {"kind": "task", "source": "ray", "task_id": f"rf{i}", "attempt": 0,
                "job_id": "02000000", "name": "flaky_reader"}
        rows += [event(**task, state="RUNNING", time=at(900 + i)),
                 event(**task, state="FAILED", time=at(900.2 + i + i * 0.3),
                       error_type="TASK_EXECUTION_EXCEPTION", error_message="the reader stopped")]
    return rows


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("platform") / "lake"
    write_sample_store(local_put(root))
    write_rows(local_put(root), ray_ops() + small_metrics() + restarted_agent()
               + stopped_agent() + ray_failures() + long_ids() + long_run(),
               "part-00050.parquet")
    return root


@pytest.fixture(scope="module")
def ray_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ray_lake(tmp_path_factory.mktemp("platform-ray") / "lake", 2000, span_s=90)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def open_page(browser: Any, root: Path, width: int) -> Iterator[Page]:
    store = Store(StoreOptions(str(root), refresh_s=60))
    with serving(store) as url, tab(browser, url, width=width, height=1000) as opened:
        yield opened


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def page(request: pytest.FixtureRequest, browser: Any, lake: Path) -> Iterator[Page]:
    yield from open_page(browser, lake, request.param)


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def ray_page(request: pytest.FixtureRequest, browser: Any, ray_lake: Path) -> Iterator[Page]:
    yield from open_page(browser, ray_lake, request.param)


def shot(page: Page, name: str) -> None:
    width = page.viewport_size["width"] if page.viewport_size else 0
    page.screenshot(path=str(ARTIFACTS / f"platform-{name}-{width}.png"), full_page=True)


def rect(page: Page, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, f"{selector} is not shown"
    return {key: float(found[key]) for key in ("x", "y", "width", "height")}


def not_cut(page: Page, selector: str) -> list[str]:
    """The texts of `selector` cut by their box (scrollWidth over clientWidth)."""
    cut: list[str] = page.evaluate(
        "(sel) => [...document.querySelectorAll(sel)]"
        ".filter((e) => e.scrollWidth > e.clientWidth).map((e) => e.textContent)", selector)
    return cut


def test_the_row_of_ops_without_a_run_id_opens_and_says_what_it_holds(page: Page) -> None:
    page.goto("/#/runs")
    link = page.locator("a.no-run")
    expect(link).to_have_text("(ops without a run id)")
    assert link.get_attribute("href") == "#/run?run="
    assert "ray_op" in (link.get_attribute("title") or "")
    shot(page, "runs")
    link.click()
    expect(page.locator("h1")).to_have_text("Steps of ops without a run id")
    expect(page.locator("#no-run-note")).to_contain_text("Ray ops (ray_op, traced_remote)")
    expect(page.locator("table.steps")).to_contain_text("4 ops: epoch, ray_job.work")
    assert page.locator(".error-box").count() == 0


def test_ray_traced_ops_are_a_trace_with_one_row_per_span(page: Page) -> None:
    page.goto("/#/traces")
    row = page.locator("table.grid tbody tr", has_text=TRACE)
    expect(row).to_contain_text("epoch")
    expect(row.locator("td[data-col=services]")).to_have_text("ray")  # the ops' source
    row.locator("a", has_text=TRACE).click()
    expect(page.locator("h2", has_text="Waterfall")).to_have_text("Waterfall (4 spans)")
    shot(page, "ray-trace")


def test_the_ray_timeline_fills_the_width_with_lanes_named_by_ip_and_pid(ray_page: Page) -> None:
    page = ray_page
    page.goto(f"/#/timeline?job={JOB}")
    expect(page.locator("#timeline-count")).to_contain_text("2,000 task attempts")
    expect(page.locator("#timeline-count")).to_contain_text("times are UTC")
    page.wait_for_function(
        "document.querySelector('canvas.timeline-canvas').dataset.bars === '2000'")
    shot(page, "timeline")
    canvas = page.locator("canvas.timeline-canvas")
    width = page.evaluate("window.innerWidth")
    box = rect(page, "canvas.timeline-canvas")
    assert box["width"] >= width - 60, (box, width)  # the whole page's width, less its padding
    assert int(canvas.get_attribute("data-row-px") or 0) >= 18  # a lane a pointer can hold
    labels = (canvas.get_attribute("data-axis-labels") or "").split()
    assert labels and all(re.fullmatch(r"\d\d:\d\d:\d\d(\.\d+)?", t) for t in labels), labels
    assert labels[0].startswith("00:00:")  # the job's clock (it ran from midnight), not "0 µs"
    # each tick is a whole step of UTC and says its own time (the job's first bar starts
    # at a fraction of a second: ticks counted from it were labelled that much early)
    ticks = [int(t) for t in (canvas.get_attribute("data-axis-ticks-us") or "").split()]
    step_us = int(canvas.get_attribute("data-axis-step-us") or 0)
    assert ticks and step_us and all(t % step_us == 0 for t in ticks), (ticks, step_us)
    from datetime import UTC, datetime
    said = [datetime.fromtimestamp(t / 1e6, UTC).strftime("%H:%M:%S.%f") for t in ticks]
    assert all(s.startswith(label) for s, label in zip(said, labels, strict=True)), (said, labels)
    row_px = int(canvas.get_attribute("data-row-px") or 20)
    page.mouse.move(box["x"] + 20, box["y"] + 22 + row_px / 2)  # over the first lane's label
    tip = page.locator(".timeline-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("(10.0.0.1)")
    expect(tip).to_contain_text("pid ")


def test_a_long_run_shows_its_failed_and_last_steps_and_the_rest_on_a_click(
        page: Page) -> None:
    page.goto("/#/run?run=long")
    rows = page.locator("table.grid.steps tbody tr")
    expect(rows).to_have_count(201)  # the last 200, and the failed step 10
    expect(page.locator("table.grid.steps tbody tr[data-step='10']")).to_have_count(1)
    expect(page.locator("#more-steps")).to_contain_text("399 of 600 steps are not shown")
    page.locator("#more-steps button").click()
    expect(rows).to_have_count(600)
    expect(page.locator("#more-steps")).to_have_count(0)


def test_metric_axes_show_whole_numbers_and_a_constant_once(page: Page) -> None:
    page.goto("/#/run?run=tiny")
    loss = page.locator("svg.metric", has=page.locator("text.chart-title", has_text="loss"))
    expect(loss).to_be_visible()
    shot(page, "metric-axes")
    chart = loss.bounding_box()
    assert chart is not None
    for label in loss.locator("text.y-label").all():
        edge = label.bounding_box()
        assert edge is not None and edge["x"] >= chart["x"], (label.text_content(), edge, chart)
    assert "0.000692" in loss.locator("text.y-label").all_text_contents()
    lr = page.locator("svg.metric", has=page.locator("text.chart-title", has_text="lr"))
    assert lr.locator("text.y-label").all_text_contents() == ["0.01"]
    rate = page.locator("svg.metric", has=page.locator("text.chart-title", has_text="tokens_per_s"))
    assert rate.locator("text.y-label").all_text_contents() == ["3,931,860.6", "3,928,860.6"]


def test_quantile_labels_and_error_names_are_whole_and_apart(page: Page) -> None:
    page.goto("/#/groups?by=error_type")
    cell = page.locator("table.grid tbody td span", has_text="TASK_EXECUTION_EXCEPTION")
    expect(cell).to_be_visible()
    shot(page, "groups-errors")
    # the table fits the page; at 1920 px the row has room for the whole name, at 1280 px
    # it is cut and whole in its tooltip
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    grid = rect(page, "table.grid")
    assert grid["x"] + grid["width"] <= page.evaluate("window.innerWidth"), grid
    if page.evaluate("window.innerWidth") >= 1920:
        assert not not_cut(page, "table.grid tbody td[data-col=value] span")
    else:
        assert cell.get_attribute("title") == "TASK_EXECUTION_EXCEPTION"
    for histogram in page.locator("svg.histogram").all():
        boxes = [b for b in (label.bounding_box() for label in
                             histogram.locator("text.quantile-label").all()) if b]
        for left, right in itertools.pairwise(boxes):
            assert left["x"] + left["width"] + 2 <= right["x"], (left, right)


def test_long_ids_show_both_ends_and_whole_in_their_tooltip(page: Page) -> None:
    page.goto("/#/tasks?name=long_ids")
    links = page.locator("table.grid tbody td[data-col=task_id] a")
    expect(links).to_have_count(2)
    shown = sorted(links.all_inner_texts())
    assert shown == ["demo-…task-206", "demo-…task-207"], shown
    assert sorted(a.get_attribute("title") or "" for a in links.all()) == LONG_IDS
    assert not_cut(page, "table.grid tbody td[data-col=task_id] a") == []


def test_the_page_uses_the_width_and_a_24_hour_utc_clock(page: Page) -> None:
    page.goto("/#/tasks")
    expect(page.locator("#task-count")).to_be_visible()
    width = page.evaluate("window.innerWidth")
    assert rect(page, "main")["width"] >= width - 20
    assert rect(page, "table.grid")["width"] >= width - 60
    expect(page.locator("#updated")).to_have_text(re.compile(r"updated \d\d:\d\d:\d\d UTC"))
    # One line of header beside a long store path: the path is cut (whole in its tooltip).
    nav, status = rect(page, "header nav"), rect(page, "header .status")
    assert abs(nav["y"] - status["y"]) < nav["height"], (nav, status)
    assert not_cut(page, "#updated") == []


def test_the_agents_page_shows_a_restart_and_a_heartbeat_gap(page: Page) -> None:
    page.goto("/#/agents")
    row = page.locator("table.grid tbody tr", has_text="nodeR")
    expect(row.locator("td[data-col=restarts]")).to_have_text("1last 10:00:55.000")
    expect(row.locator("td[data-col=longest_gap_s]")).to_have_text("45.00 s1 missed")
    grid = rect(page, "table.grid")  # every column on the page, the last one too
    assert grid["x"] + grid["width"] <= page.evaluate("window.innerWidth"), grid
    expect(row.locator("td[data-col=received_total]")).to_have_text("50")
    # what the rates add up, where a reader sees recv/s and deliv/s differ
    expect(page.locator("th[data-col=delivered_per_s]")).to_have_attribute(
        "title", re.compile("all sinks added"))
    expect(page.locator("#agents-note")).to_contain_text("an event two sinks take counts twice")
    shot(page, "agents")
    quiet = page.locator("table.grid tbody tr", has_text="nodeA")
    expect(quiet.locator("td[data-col=restarts]")).to_have_text("0")
    stopped = page.locator("table.grid tbody tr", has_text="nodeS")  # stopped, not lost
    expect(stopped.locator("td[data-col=state]")).to_have_text("stopped")
    expect(stopped.locator("td[data-col=state] .error-text")).to_have_count(0)
    # its last beat was written as it began to stop, before its drain: said so
    expect(stopped.locator("td[data-col=spool_bytes]")).to_contain_text("at stop")
    assert not quiet.locator("td[data-col=spool_bytes]").inner_text().endswith("at stop")


def test_evagg_query_agents_prints_counts_as_integers(lake: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(lake),
                           "--no-cache", "agents"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = lines[0].split()
    node_r = next(line for line in lines if line.startswith("nodeR")).split()
    received = node_r[head.index("received_total") + 1]  # last_seen is two words
    assert received == "50", done.stdout
    assert "restarts" in head and "longest_gap_s" in head
    node_a = next(line for line in lines if line.startswith("nodeA"))
    assert " 400 " in node_a and "400.000" not in node_a and " 8 " in node_a
