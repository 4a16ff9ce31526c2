"""A long trace's span details, in headless Chromium: a click shows them in sight.

A training run inside one span makes a waterfall of hundreds of rows (four ops a step);
the picked span's details are below the waterfall, so they must stay in the window
rather than appear thousands of pixels under the row that was clicked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.lakegen import at, event, local_put, write_rows
from tests.dashboard.serve import serving

TRACE = "5b8efff798038103d269b633813fc60c"
STEPS = 150


def long_trace() -> list[dict[str, Any]]:
    """A root span failing at its last step, and one span per step under it."""
    def span(name: str, span_id: str, parent: str | None, start: float, seconds: float,
             **extra: Any) -> dict[str, Any]:
        return event(kind="span", source="otel", name=name, trace_id=TRACE, span_id=span_id,
                     parent_span_id=parent, time=at(start), duration_s=seconds,
                     state=extra.pop("state", "FINISHED"), node_id="nodeA",
                     attrs={"service.name": "trainer"}, **extra)

    root = "b" + "0" * 15
    failed = {"state": "FAILED", "error_type": "RuntimeError",
              "error_message": f"boom at step {STEPS - 1}"}
    rows = [span("trainer.train", root, None, 0.0, STEPS * 0.01 + 0.01, **failed)]
    rows += [span("step", f"c{i:015x}", root, 0.005 + i * 0.01, 0.008, step=i,
                  **(failed if i == STEPS - 1 else {})) for i in range(STEPS)]
    return rows


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    root = tmp_path / "lake"
    write_rows(local_put(root), long_trace(), "part-0.parquet")
    store = Store(StoreOptions(str(root), refresh_s=0.2))
    try:
        with serving(store) as url, chromium() as browser, \
                tab(browser, url, width=1280, height=900) as opened:
            yield opened
    finally:
        store.close()


def test_a_picked_span_of_a_long_waterfall_shows_its_details_in_the_window(page: Page) -> None:
    page.goto(f"/#/trace?trace_id={TRACE}")
    rows = page.locator("svg.waterfall g.span-row")
    expect(rows).to_have_count(STEPS + 1)
    detail = page.locator(".span-detail")
    rows.first.click()  # the root, at the top of a waterfall of 3,600 px
    expect(detail).to_contain_text("boom at step 149")
    expect(detail).to_be_in_viewport()
    page.screenshot(path=str(ARTIFACTS / "trace-long-picked.png"))
    rows.nth(40).click()  # further down, after scrolling to it: still in sight
    expect(detail.locator("dd").first).to_have_text("step")
    expect(detail).to_be_in_viewport()
    rows.last.click()  # the last row: the details sit under the waterfall, not over it
    expect(detail).to_contain_text("boom at step 149")
    expect(detail).to_be_in_viewport()
    box, last = detail.bounding_box(), rows.last.bounding_box()
    assert box is not None and last is not None
    assert box["y"] >= last["y"] + last["height"] - 1, (box, last)
