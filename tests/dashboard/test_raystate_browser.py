"""The Ray timeline page in real headless Chromium over a job of 100,000 task attempts:
it draws every bar, zooms, pans, and a click on a bar opens that task's page.

The screenshot goes to test-artifacts/dashboard/ray-timeline-100k.png.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.raygen import JOB, write_ray_lake
from tests.dashboard.serve import serving

TASKS = 100_000
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    lake = write_ray_lake(tmp_path_factory.mktemp("ray100k"), TASKS, span_s=600)
    store = Store(StoreOptions(str(lake), refresh_s=60))
    with serving(store) as url:
        yield url


@pytest.fixture
def page(site: str) -> Iterator[Page]:
    with chromium() as browser, tab(browser, site, width=1400, height=2200,
                                    timeout_ms=60_000) as opened:
        yield opened


def bars_drawn(page: Page) -> int:
    return int(page.locator("canvas.timeline-canvas").get_attribute("data-bars") or 0)


def test_timeline_draws_a_100k_task_job_and_a_click_opens_the_task(page: Page) -> None:
    page.goto(f"/#/timeline?job={JOB}")
    expect(page.locator("#timeline-count")).to_contain_text("100,000 task attempts", timeout=60_000)
    expect(page.locator("#timeline-count")).to_contain_text("128 workers")
    page.wait_for_function(
        "document.querySelector('canvas.timeline-canvas').dataset.bars === '100000'")
    page.screenshot(path=str(ARTIFACTS / "ray-timeline-100k.png"), full_page=False)
    # The job ends on a tick: its label is drawn inside the canvas, not cut at its edge.
    axis = page.evaluate("(() => { const c = document.querySelector('canvas.timeline-canvas');"
                         " return [Number(c.dataset.axisLabelsEnd), c.clientWidth,"
                         " Number(c.dataset.axisLabelsFlipped)]; })()")
    assert 0 < axis[0] <= axis[1] and axis[2] == 1, axis  # the last label, on its left

    canvas = page.locator("canvas.timeline-canvas")
    box = canvas.bounding_box()
    assert box is not None
    for _ in range(12):  # zoom in around the middle: fewer bars are on screen
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 200)
        page.mouse.wheel(0, -300)
    page.wait_for_function(
        "Number(document.querySelector('canvas.timeline-canvas').dataset.bars) < 100000")
    zoomed = bars_drawn(page)
    page.mouse.move(box["x"] + 700, box["y"] + 100)
    page.mouse.down()
    page.mouse.move(box["x"] + 1100, box["y"] + 100, steps=5)  # pan to earlier times
    page.mouse.up()
    assert bars_drawn(page) > 0
    page.screenshot(path=str(ARTIFACTS / "ray-timeline-zoomed.png"), full_page=False)

    canvas.dblclick(position={"x": 5, "y": 5})  # back to the whole job
    page.wait_for_function(
        "document.querySelector('canvas.timeline-canvas').dataset.bars === '100000'")
    assert zoomed < TASKS
    # The first lane is busy end to end at this scale: a click on it hits a bar.
    for x in range(400, 1300, 50):
        canvas.click(position={"x": x, "y": 22 + 7})
        if "#/task?" in page.url:
            break
    assert "#/task?" in page.url, "no bar under the first lane's clicks"
    assert "session=session_" in page.url  # task ids repeat across Ray clusters
    expect(page.locator("main h2").first).to_contain_text("attempt 0")
    expect(page.locator("main")).to_contain_text("fn_")
