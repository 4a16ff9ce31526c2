"""What a newcomer sees in the dashboard, in real headless Chromium at 1280 and 1920 px:
element sizes and what lies inside the viewport, not only that a page loads.

Screenshots of every check go to test-artifacts/dashboard/ at the repository root
(`<check>-<width>.png`, and `-viewport.png`: what shows without scrolling).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.lakegen import Row, at, event, local_put, write_rows, write_sample_store
from tests.dashboard.serve import serving

WIDTHS = (1280, 1920)
LONG_TASK = "c8ef45ccd0112571ffffffffffffffffffffffff01000000"  # Ray's ids are this long
LONG_WORKER = "0d3f4b8a9c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c"
BAD_SHARD = ("ValueError: bad shard 12: the reader found 3 columns where the schema has 5; "
             "re-export shard 12 or drop it from the manifest")


def layout_rows() -> list[Row]:
    """The cases: tasks of about 95 µs, Ray-long ids with a long error whose message
    repeats its type, states that share a time, a burst of events, a NaN loss."""
    rows = [event(kind="task", name="tiny", state="FINISHED", time=at(400 + i * 0.01),
                  duration_s=(90 + i % 10) * 1e-6) for i in range(73)]  # no task_id: one each
    ray = {"kind": "task", "source": "ray", "task_id": LONG_TASK, "attempt": 0,
           "job_id": "02000000", "node_id": "a" * 56, "worker_id": LONG_WORKER}
    rows += [event(**ray, name="read_shard_with_a_long_function_name", state="DEFINED",
                   time=at(410)),
             event(**ray, state="RUNNING", time=at(410.5)),
             event(**ray, state="FAILED", time=at(412), error_type="ValueError",
                   error_message=BAD_SHARD, stack_trace="Traceback: ...\n" + BAD_SHARD)]
    rows.append(event(kind="task", task_id="load1", name="load_shard", state="FINISHED",
                      time=at(415), duration_s=0.8, pid=16648, job_id="01000000"))
    tie = {"kind": "task", "task_id": "tie", "name": "tie"}
    rows += [event(**tie, state="PENDING", time=at(420)),
             event(**tie, state="SUBMITTED", time=at(420)),
             event(**tie, state="RUNNING", time=at(420) + 1000),
             event(**tie, state="FINISHED", time=at(420) + 2000)]
    rows += [event(kind="burst", name="tick", time=at(500) + i * 1000) for i in range(3000)]
    for step, loss in enumerate([1.0, None, 0.8]):
        common = {"kind": "op", "source": "torch", "run_id": "nanrun", "step": step,
                  "node_id": "nodeA", "job_id": "train"}
        metrics = {"loss": loss} if loss is not None else None
        rows += [event(**common, name="forward", span_id=f"f{step}", state="FINISHED",
                       time=at(600 + step), duration_s=0.1, metrics=metrics,
                       nonfinite=None if loss is not None else ["loss"]),
                 event(**common, name="optimizer.step", span_id=f"o{step}", state="FINISHED",
                       time=at(600.5 + step), duration_s=0.05)]
    return rows


@pytest.fixture(scope="module")
def layout_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layout") / "lake"
    write_sample_store(local_put(root))
    write_rows(local_put(root), layout_rows(), "part-00040.parquet")
    return root


@pytest.fixture(scope="module")
def empty_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("empty") / "lake"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def tasks_only_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tasks-only") / "lake"
    write_rows(local_put(root), [event(kind="task", name="solo", state="FINISHED", time=at(1),
                                       duration_s=1.0)], "part-00001.parquet")
    return root


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def page(request: pytest.FixtureRequest, browser: Any, layout_lake: Path) -> Iterator[Page]:
    yield from open_page(browser, layout_lake, request.param)


def open_page(browser: Any, lake: Path, width: int) -> Iterator[Page]:
    """A dashboard over `lake`, in a tab `width` px wide."""
    store = Store(StoreOptions(str(lake), refresh_s=0.2))
    with serving(store) as url, tab(browser, url, width=width, height=900) as opened:
        yield opened


def shot(page: Page, name: str) -> None:
    """The whole page, and what the viewport shows without scrolling."""
    width = page.viewport_size["width"] if page.viewport_size else 0
    page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}-{width}-viewport.png"))


def box(page: Page, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, f"{selector} is not shown"
    return dict(found)


def box_of(locator: Any) -> dict[str, float]:
    found = locator.bounding_box()
    assert found is not None
    return dict(found)


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def inside_viewport(page: Page, rect: dict[str, float]) -> bool:
    """Wholly within the viewport's width (the page may scroll down, never sideways)."""
    width = page.evaluate("window.innerWidth")
    return rect["x"] >= 0 and rect["x"] + rect["width"] <= width


def no_sideways_scroll(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_histograms_are_large_with_an_axis_and_quantiles(page: Page) -> None:
    page.goto("/#/groups?by=name")
    row = page.locator("table.grid tbody tr", has_text="square")
    histogram = row.locator("svg.histogram")
    expect(histogram).to_be_visible()
    shot(page, "groups-histograms")
    size = histogram.bounding_box()
    assert size is not None and size["width"] >= 240 and size["height"] >= 64, size
    assert inside_viewport(page, size) and no_sideways_scroll(page)
    ticks = histogram.locator("text.hist-tick").all_text_contents()
    assert len(ticks) >= 3 and "1 s" in ticks, ticks
    labels = histogram.locator("text.quantile-label").all_text_contents()
    assert labels == ["p50", "p90", "p99"]
    titles = histogram.locator("line.quantile title").all_text_contents()
    assert titles == ["p50: 5.50 s", "p90: 9.10 s", "p99: 9.91 s"]


def test_quantile_labels_never_lie_on_each_other_or_past_the_edge(page: Page) -> None:
    page.goto("/#/groups?by=name")
    expect(page.locator("svg.histogram").first).to_be_visible()
    assert page.locator("svg.histogram text.quantile-label").count() >= 9
    for histogram in page.locator("svg.histogram").all():
        edge = histogram.bounding_box()
        boxes = [b for b in (label.bounding_box() for label in
                             histogram.locator("text.quantile-label").all()) if b]
        assert edge is not None
        if not boxes:
            continue  # a row without durations has no quantiles
        for a, b in itertools.pairwise(boxes):
            assert a["x"] + a["width"] <= b["x"] + 0.5, (a, b)  # left to right, apart
        assert boxes[0]["x"] >= edge["x"] - 0.5
        assert boxes[-1]["x"] + boxes[-1]["width"] <= edge["x"] + edge["width"] + 0.5


def test_the_tallest_bin_of_microsecond_tasks_says_microseconds(page: Page) -> None:
    page.goto("/#/groups?by=name")
    row = page.locator("table.grid tbody tr", has_text="tiny")
    expect(row.locator("svg.histogram rect.hist-bar").first).to_be_attached()
    bars = row.locator("svg.histogram rect.hist-bar title").all_text_contents()
    counts = [(int(t.split()[0]), t) for t in bars]
    top = max(counts)[1]
    found = re.fullmatch(r"(\d+) tasks (\d+) µs\u2013(\d+) µs", top)  # "56 µs-100 µs"
    assert found, top
    assert int(found[2]) <= 90 and int(found[3]) >= 99, top  # the tasks took 90-99 µs
    assert sum(n for n, _ in counts) == 73


def test_the_task_table_fits_with_duration_and_error_in_view(page: Page) -> None:
    page.goto("/#/tasks?sort=task_id&order=asc&limit=200")
    expect(page.locator("table.grid.tasks")).to_be_visible()
    shot(page, "tasks-table")
    heads = page.locator("table.grid.tasks thead th").all_inner_texts()
    assert sum("started" in h for h in heads) == 1
    assert not any(word in " ".join(heads) for word in ("pending", "running", "finished"))
    assert no_sideways_scroll(page), page.evaluate("document.documentElement.scrollWidth")
    table = box(page, "table.grid.tasks")
    assert inside_viewport(page, table), table
    # the table cuts a long id in the middle (c8ef4…01000000): the row is found by its
    # link's tooltip, which holds the whole id
    ray_row = page.locator("table.grid.tasks tbody tr",
                           has=page.locator(f"a[title='{LONG_TASK}']"))
    for column in ("duration_s", "error_type"):
        cell = ray_row.locator(f"td[data-col={column}]").bounding_box()
        assert cell is not None and inside_viewport(page, cell), (column, cell)
    error = ray_row.locator("td[data-col=error_type] span")
    assert error.get_attribute("title") == BAD_SHARD  # whole in its tooltip
    assert error.inner_text().startswith("ValueError: bad shard 12")
    assert ray_row.locator("td[data-col=duration_s]").inner_text() == "1.50 s"
    clock = ray_row.locator("td[data-col=time]").inner_text()
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", clock), clock
    # numbers are never cut: a duration, a pid or a job id with an ellipsis says nothing
    cut = page.evaluate("""() => [...document.querySelectorAll(
        'table.grid.tasks td[data-col=duration_s], table.grid.tasks td[data-col=pid],'
        + 'table.grid.tasks td[data-col=job_id]')]
        .filter(td => td.scrollWidth > td.clientWidth + 1).map(td => td.innerText)""")
    assert cut == [], cut


def test_the_error_type_is_printed_once(page: Page) -> None:
    page.goto(f"/#/task?task_id={LONG_TASK}")
    error = page.locator("section", has=page.locator("h2", has_text="Error")).locator("p")
    expect(error).to_have_text(BAD_SHARD)
    shot(page, "task-error-once")


def test_state_timeline_labels_never_overlap(page: Page) -> None:
    for task in ("tie", "flaky"):
        page.goto(f"/#/task?task_id={task}")
        expect(page.locator("dl.meta dd").first).to_have_text(task)  # this task's page
        labels = page.locator("svg.state-timeline text.state-label")
        expect(labels.first).to_be_visible()
        shot(page, f"state-timeline-{task}")
        boxes = [b for b in (labels.nth(i).bounding_box() for i in range(labels.count())) if b]
        assert len(boxes) == labels.count() >= 2
        for i, a in enumerate(boxes):
            assert inside_viewport(page, a)
            for b in boxes[i + 1:]:
                apart = (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                         or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])
                assert apart, (task, a, b)
    page.goto("/#/task?task_id=tie")
    labels = page.locator("svg.state-timeline text.state-label")
    expect(labels.first).to_have_text("PENDING · SUBMITTED")  # one time, one label
    assert labels.all_text_contents()[1:] == ["RUNNING +1 µs", "FINISHED +2 µs"]


def test_events_over_time_keep_small_buckets_visible_beside_a_burst(page: Page) -> None:
    page.goto("/")
    chart = page.locator("svg.timeline")
    expect(chart).to_be_visible()
    shot(page, "overview")
    bars: dict[float, float] = {}  # x -> height of the whole bar (its kinds stacked)
    for rect in chart.locator("rect.bar").all():
        found = rect.bounding_box()
        if found:
            bars[round(found["x"], 1)] = bars.get(round(found["x"], 1), 0) + found["height"]
    assert max(bars.values()) > 100
    assert min(bars.values()) >= 8, sorted(bars.values())[:5]  # linear: under 1 px
    assert len(chart.locator("text.y-tick").all()) >= 3
    expect(page.locator("section h2", has_text="log scale")).to_have_count(1)


def legend_colours(page: Page) -> dict[str, str]:
    page.goto("/")
    expect(page.locator("svg.timeline")).to_be_visible()
    return dict(page.evaluate("""Object.fromEntries([...document.querySelectorAll(
        '.legend span')].map((s) => [s.textContent, s.querySelector('i').style.background]))"""))


@pytest.mark.parametrize("width", WIDTHS[:1])
def test_a_kind_keeps_its_colour_whichever_kinds_are_beside_it(
        browser: Any, layout_lake: Path, tasks_only_lake: Path, width: int) -> None:
    for page in open_page(browser, layout_lake, width):
        many = legend_colours(page)
    for page in open_page(browser, tasks_only_lake, width):
        alone = legend_colours(page)
    assert {"task", "op", "burst"} <= set(many) and set(alone) == {"task"}
    assert alone["task"] == many["task"]
    assert len(set(many.values())) == len(many)  # and no two kinds share one


def test_the_overview_counts_failed_ops(page: Page) -> None:
    page.goto("/")
    expect(page.locator("#failed-ops")).to_have_text("1")  # the sample run's failed backward
    card = page.locator(".card", has=page.locator("#failed-ops"))
    expect(card).to_contain_text("of 20 ops")  # 14 in run1 and run2, 6 in nanrun
    assert inside_viewport(page, box(page, "#failed-ops"))


def test_nan_steps_are_marked_on_the_run_page(page: Page) -> None:
    page.goto("/#/run?run=nanrun")
    step = page.locator("table.steps tbody tr[data-step='1']")
    expect(step).to_contain_text("loss NaN/inf")
    expect(page.locator("table.steps tbody tr.has-nonfinite")).to_have_count(1)
    loss = page.locator("svg.metric", has=page.locator("text.chart-title", has_text="loss"))
    expect(loss.locator("g.nan-mark[data-step='1']")).to_have_count(1)
    shot(page, "run-nan-step")


@pytest.fixture(scope="module")
def diverged_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose loss was NaN from its first step (the tracker's rows: the loss in
    `nonfinite`, never in `metrics`), its grad_norm finite throughout."""
    root = tmp_path_factory.mktemp("diverged") / "lake"
    rows = []
    for step in range(3):
        common = {"kind": "op", "source": "torch", "run_id": "diverged", "step": step}
        rows += [event(**common, name="forward", span_id=f"f{step}", state="FINISHED",
                       time=at(600 + step), duration_s=0.1),
                 event(**common, name="train_step", span_id=f"t{step}", state="FINISHED",
                       time=at(600 + step), duration_s=0.2,
                       metrics={"grad_norm": 1.0 + step}, nonfinite=["loss"])]
    write_rows(local_put(root), rows, "part-00001.parquet")
    return root


def test_a_metric_nan_at_every_step_shows_no_made_up_value(browser: Any,
                                                           diverged_lake: Path) -> None:
    """Its chart marks each step NaN and says it has no finite value; it put "0" on the
    axis before, and "loss was 0 at every step" in the tooltip: a loss it never had."""
    for page in open_page(browser, diverged_lake, 1280):
        page.goto("/#/run?run=diverged")
        loss = page.locator("svg.metric", has=page.locator("text.chart-title", has_text="loss"))
        expect(loss.locator("g.nan-mark")).to_have_count(3)
        expect(loss.locator("text.no-finite")).to_have_text("no finite value at any step")
        expect(loss.locator("text.y-label")).to_have_count(0)
        expect(loss.locator("title", has_text="at every step")).to_have_count(0)
        grad = page.locator("svg.metric",
                            has=page.locator("text.chart-title", has_text="grad_norm"))
        expect(grad.locator("text.y-label")).to_have_text(["3", "1"])  # finite: as before
        # each "NaN" is legible: inside its chart, clear of the chart's title
        chart, title = box_of(loss), box_of(loss.locator("text.chart-title"))
        for label in loss.locator("g.nan-mark text").all():
            mark = box_of(label)
            right = chart["x"] + chart["width"]
            assert chart["x"] <= mark["x"] and mark["x"] + mark["width"] <= right
            assert not overlap(mark, title), (mark, title)
        shot(page, "run-nan-every-step")


def test_the_runs_table_names_its_time_as_the_run_page_and_the_cli_do(
        browser: Any, diverged_lake: Path) -> None:
    """Each step's train_step (200 ms) spans its forward (100 ms): the run's time is its
    steps' wall times summed, 600 ms, as `evagg query runs` gives in `seconds` and the Run
    page in "wall time". The column said "op time", which read as the ops' durations
    summed (900 ms here)."""
    for page in open_page(browser, diverged_lake, 1280):
        page.goto("/#/runs")
        header = page.locator("table.grid th[data-col='seconds']")
        expect(header).to_have_text("wall time")
        expect(header.locator("span")).to_have_attribute("title", re.compile("wall times summed"))
        row = page.locator("table.grid tbody tr", has=page.locator("a", has_text="diverged"))
        expect(row.locator("td[data-col='seconds']")).to_have_text("600.0 ms")
        page.goto("/#/run?run=diverged")
        expect(page.locator("table.steps thead")).to_contain_text("wall time")


@pytest.mark.parametrize("width", WIDTHS)
def test_an_empty_store_says_once_how_to_send_data(browser: Any, empty_lake: Path,
                                                   width: int) -> None:
    for page in open_page(browser, empty_lake, width):
        for route in ("/", "/#/tasks", "/#/traces"):
            page.goto(route)
            state = page.locator(".empty-state")
            expect(state).to_contain_text("No events yet")
            expect(state).to_contain_text("evagg emit --kind task")
            expect(page.locator(".error-box")).to_have_count(0)
            page.wait_for_timeout(600)  # a poll of /api/info
            expect(page.locator("#banner")).to_be_hidden()
            text = page.locator("body").inner_text()
            assert text.count("No events yet") == 1 and "no Parquet files" not in text
        shot(page, "empty-store")


@pytest.mark.parametrize("width", WIDTHS)
def test_empty_pages_say_how_to_fill_them(browser: Any, tasks_only_lake: Path,
                                          width: int) -> None:
    for page in open_page(browser, tasks_only_lake, width):
        page.goto("/#/traces")
        expect(page.locator(".empty-state")).to_contain_text("/v1/traces")
        expect(page.locator(".empty-state")).to_contain_text("otel.init_telemetry")
        shot(page, "traces-empty")
        page.goto("/#/runs")
        expect(page.locator(".empty-state")).to_contain_text("emitters.op(")
        page.goto("/#/agents")
        expect(page.locator(".empty-state")).to_contain_text("evagg run")
        page.goto("/#/timeline")  # tasks, but none from Ray: no red box either
        expect(page.locator(".empty-state")).to_contain_text("No Ray tasks yet")
        expect(page.locator(".empty-state")).to_contain_text("RAY_enable_ray_event=1")
        expect(page.locator(".error-box")).to_have_count(0)
        page.goto("/#/tasks")
        expect(page.locator("#task-count")).to_have_text("1 task attempt")


LONG_RUN = ("resnet-tiny-sweep-lr-3e-4-bs-256-warmup-500-cosine-decay-seed-1234-"
            "node-a100-80gb-2026-12-07")
LONG_JOB = "job-etl-2026-12-07-nightly-backfill-of-all-partitions-for-the-warehouse"
LONG_ERROR = "bad shard s3://bucket/very/long/path/" + "x" * 200


def long_rows() -> list[Row]:
    """What a newcomer's lake held: a long run id, long span and service names, a long
    job id, a rate metric, a minute-long task, an error with no space to wrap at."""
    rows: list[Row] = []
    for step in range(3):
        rows.append(event(kind="op", source="torch", run_id=LONG_RUN, step=step, name="forward",
                          span_id=f"lf{step}", state="FINISHED", time=at(700 + step),
                          duration_s=0.1, metrics={"tokens_per_s": 1000.0 + step,
                                                   "data_wait_s": 0.012}))
    rows.append(event(kind="op", source="torch", run_id=LONG_RUN, step=2, name="backward",
                      span_id="lb2", state="FAILED", time=at(702.5), duration_s=0.2,
                      error_type="RuntimeError", error_message="CUDA out of memory"))
    trace = "9c" * 16
    rows.append(event(kind="span", source="otel", name="handle_request /v1/chat/completions"
                      "?model=a-very-long-model-name-for-serving", trace_id=trace,
                      span_id="b000000000000001", time=at(710), duration_s=0.02,
                      state="FINISHED", attrs={"service.name": "inference-service-with-a-long-"
                                               "name-in-the-us-east-region"}))
    rows += [event(kind="task", task_id=f"long{i}", name="backfill", job_id=LONG_JOB,
                   state="FINISHED", time=at(720 + i), duration_s=61.0) for i in range(3)]
    rows.append(event(kind="task", task_id="wide1", name="backfill", job_id=LONG_JOB,
                      state="FAILED", time=at(730), duration_s=1.0, error_type="ValueError",
                      error_message=LONG_ERROR, stack_trace="Traceback: ...\n" + LONG_ERROR))
    return rows


@pytest.fixture(scope="module")
def long_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("long") / "lake"
    write_rows(local_put(root), long_rows(), "part-00001.parquet")
    return root


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def long_page(request: pytest.FixtureRequest, browser: Any, long_lake: Path) -> Iterator[Page]:
    yield from open_page(browser, long_lake, request.param)


@pytest.mark.parametrize("route", ["runs", "traces", "groups?by=job", "groups?by=name"])
def test_every_column_is_in_view_whatever_the_names_length(long_page: Page, route: str) -> None:
    """Long run ids, span names, services and job ids are cut with their whole text in
    the tooltip, so the last column (a run's end, a trace's start, the max) shows."""
    long_page.goto(f"/#/{route}")
    last = long_page.locator("table.grid thead th").last
    expect(last).to_be_visible()
    shot(long_page, f"long-{route.replace('?by=', '-')}")
    assert inside_viewport(long_page, dict(last.bounding_box() or {})), route
    assert no_sideways_scroll(long_page)


def test_a_rate_metric_reads_as_a_number_and_a_seconds_one_as_a_duration(
        long_page: Page) -> None:
    long_page.goto(f"/#/run?run={LONG_RUN}")
    cells = long_page.locator("table.steps tbody tr[data-step='0']")
    expect(cells).to_contain_text("tokens_per_s 1,000")
    expect(cells).to_contain_text("data_wait_s 12.0 ms")


def test_a_minute_long_task_s_decade_reads_100_s(long_page: Page) -> None:
    long_page.goto("/#/groups?by=name")
    expect(long_page.locator("svg.histogram").first).to_be_visible()
    ticks = long_page.locator("svg.histogram text.hist-tick").all_text_contents()
    assert "100 s" in ticks and "2 min" not in ticks, ticks


def test_an_error_with_no_space_wraps_inside_the_page(long_page: Page) -> None:
    long_page.goto("/#/task?task_id=wide1")
    expect(long_page.locator("pre.stack")).to_contain_text("bad shard")
    shot(long_page, "task-long-error")
    assert no_sideways_scroll(long_page)


def test_a_run_charts_its_step_times_and_opens_its_failed_step(long_page: Page) -> None:
    long_page.goto(f"/#/run?run={LONG_RUN}")
    expect(long_page.locator("svg.metric text.chart-title").first).to_have_text(
        "step wall time")
    failed = long_page.locator("table.steps tbody tr[data-step='2']")
    expect(failed).to_have_class(re.compile(r"\bhas-failure\b"))
    expect(failed.locator("details")).to_have_attribute("open", "")
    expect(failed).to_contain_text("RuntimeError: CUDA out of memory")
    expect(long_page.locator("table.steps tbody tr[data-step='0'] details")).not_to_have_attribute(
        "open", "")


def test_a_long_span_name_is_cut_before_its_bar(long_page: Page) -> None:
    long_page.goto(f"/#/trace?trace_id={'9c' * 16}")
    label = long_page.locator("svg.waterfall text.span-name").first
    expect(label).to_contain_text("handle_request /v1/chat")
    assert (label.text_content() or "").endswith("…")
    assert no_sideways_scroll(long_page)


HEADER_PARTS = ("header .brand", "header nav a", "header .status label", "#updated",
                "#store-facts")


@pytest.mark.parametrize("width", (480, 1024, 1280))
def test_the_header_shows_every_link_and_the_store_it_reads(browser: Any, layout_lake: Path,
                                                            width: int) -> None:
    """At 1024 px the store's path used to be squeezed beside the nav to "/t…"; at 640 px
    (a window beside another on a laptop) the links ran past the page's right edge."""
    for page in open_page(browser, layout_lake, width):
        page.goto("/#/tasks")
        expect(page.locator("#store-facts")).to_contain_text(" files · ")
        shot(page, "header")
        assert no_sideways_scroll(page)
        for selector in HEADER_PARTS:
            for part in page.locator(selector).all():
                found = part.bounding_box()
                assert found is not None and inside_viewport(page, found), (selector, found)
        cut = page.evaluate("""(selectors) => [...document.querySelectorAll(selectors)]
            .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.textContent)""",
                            ", ".join(HEADER_PARTS))
        assert cut == [], cut
        nav, status = box(page, "header nav"), box(page, "header .status")
        assert (nav["x"] + nav["width"] <= status["x"]
                or nav["y"] + nav["height"] <= status["y"]), (nav, status)
        # the path shows about 15 characters or more, whole in the tooltip
        where = page.evaluate("""() => { const e = document.getElementById('store-where');
            return [e.clientWidth, e.scrollWidth]; }""")
        assert where[0] >= min(where[1], 100), where
        assert str(layout_lake) in (page.locator("#store-info").get_attribute("title") or "")
