"""The training pages in Chromium over a lake a real agent wrote: the hand-off example of
docs/queueing.md runs as printed and its steps show their queue time; a CPU torch loop
under TrainingTracker inside an OpenTelemetry span shows each step's wall time once (the
train step's, not the sum of its nested ops), its metrics readable, and its ops inside
that span's trace, each step's phases inside the step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from playwright.sync_api import Page, expect

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO, AgentProcess
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving

DOC = REPO / "docs" / "queueing.md"
LOADED_MS = 60_000  # a first query over a fresh lake on a loaded 2-core machine is slow

TORCH_LOOP = r"""
import orjson, torch
import emitters
from emitters import otel
from emitters.torch import TrainingTracker

torch.set_num_threads(1)
otel.init_telemetry("trainer")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with otel.get_tracer("rl").start_as_current_span("trainer.train") as span:
    with TrainingTracker(model, optimizer, run_id="torch-run") as tracker:
        for x in tracker.wrap([torch.randn(16, 8) for _ in range(3)]):  # times the waits
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            tracker.metric(loss=loss)
    trace_id = f"{span.get_span_context().trace_id:032x}"
assert emitters.flush(30)
assert otel.shutdown_telemetry(timeout_s=30)
print(orjson.dumps({"trace_id": trace_id}).decode())
"""


def doc_example() -> str:
    """The one python block of docs/queueing.md's "The hand-off" section."""
    text = DOC.read_text().split("\n## The hand-off\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, blocks
    return str(blocks[0])


def run(code: str, agent: AgentProcess) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EVAGG_SOCKET": str(agent.socket_path)}
    env.pop("EVAGG_START_AGENT", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with AgentProcess(tmp_path_factory.mktemp("agent")) as agent:
        run(doc_example(), agent)
        trace_id = orjson.loads(run(TORCH_LOOP, agent).splitlines()[-1])["trace_id"]
        # 3 requests x 3 events, 3 ops x 2, 3 steps x 4 torch ops, 1 span
        agent.wait_rows("SELECT 1 FROM events WHERE kind IN ('request', 'op', 'span')",
                        28, timeout=120)
    # stopped: a lake that no longer grows (heartbeats), as after a run
    yield {"dir": agent.lake_dir, "trace_id": trace_id}


@pytest.fixture
def page(lake: dict[str, Any]) -> Iterator[Page]:
    store = Store(StoreOptions(str(lake["dir"]), refresh_s=0.2))
    with serving(store) as url, chromium() as browser, \
            tab(browser, url, width=1400, height=900) as opened:
        yield opened
    store.close()


def step_cells(page: Page, step: int) -> dict[str, str]:
    heads = page.locator("table.steps thead th").all_inner_texts()
    cells = page.locator(f"table.steps tbody tr[data-step='{step}'] > td").all_inner_texts()
    return dict(zip(heads, cells, strict=True))


def test_the_hand_off_example_shows_queue_time_on_its_steps(page: Page) -> None:
    page.goto("/#/run?run=rl-42")
    expect(page.locator("table.steps tbody tr")).to_have_count(3, timeout=LOADED_MS)
    expect(page.locator("table.steps thead")).to_contain_text("queue time")
    for step in range(3):
        queued = step_cells(page, step)["queue time"]
        assert re.fullmatch(r"[\d.]+ (µs|ms|s)", queued), queued
    expect(page.locator("[data-ledger='answered'] .tile-value")).to_have_text("3")
    page.screenshot(path=str(ARTIFACTS / "training-queue-time.png"), full_page=True)


def test_a_step_takes_its_train_steps_wall_time_not_the_sum_of_its_ops(page: Page) -> None:
    page.goto("/#/run?run=torch-run")
    expect(page.locator("table.steps tbody tr")).to_have_count(3, timeout=LOADED_MS)
    header = page.locator("table.steps thead th", has_text="wall time")
    assert "each moment once" in (header.get_attribute("title") or "")
    for step in range(3):
        row = page.locator(f"table.steps tbody tr[data-step='{step}']")
        row.locator("summary").click()
        train_step = row.locator("li", has_text="train_step").locator(".muted").inner_text()
        cells = step_cells(page, step)
        assert cells["wall time"] == train_step, (cells, train_step)
        assert cells["queue time"] == "—"
        # one value a step reads as itself; a wait in seconds reads as a duration
        spread = cells["metric spread (min … max)"]
        assert re.search(r"data_wait_s [\d.]+ (µs|ms)\b", spread), spread
        assert re.search(r"loss [\d.]+(e-\d+)?$", spread, re.M) and "…" not in spread, spread
    page.screenshot(path=str(ARTIFACTS / "training-wall-time.png"), full_page=True)


def test_the_steps_ops_appear_inside_the_span_that_ran_them(
        page: Page, lake: dict[str, Any]) -> None:
    page.goto("/#/traces")
    page.click(f"a:text('{lake['trace_id']}')")
    rows = page.locator("svg.waterfall g.span-row")
    expect(rows).to_have_count(13, timeout=LOADED_MS)  # the span, its 3 steps x 4 ops
    labels = rows.locator("text.span-name").all_text_contents()
    assert labels[0] == "trainer.train"
    # each op says its step: 300 train_step rows alike told nothing apart
    assert {label.rsplit(" ", 1)[1] for label in labels[1:]} == {"0", "1", "2"}
    names = [label.rsplit(" ", 1)[0] if i else label for i, label in enumerate(labels)]
    assert sorted(set(names[1:])) == ["backward", "forward", "optimizer_step", "train_step"]
    xs = [float(x) for x in rows.locator("text.span-name").evaluate_all(
        "els => els.map(e => e.getAttribute('x'))")]
    # each train step one level in (a child of trainer.train), its phases inside it
    step_x = {x for x, name in zip(xs, names, strict=True) if name == "train_step"}
    phase_x = {x for x, name in zip(xs, names, strict=True) if name not in
               ("trainer.train", "train_step")}
    assert len(step_x) == 1 and len(phase_x) == 1 and xs[0] < min(step_x) < min(phase_x)
    # the waterfall takes the page's width, not a 960 px box
    width = page.locator("svg.waterfall").bounding_box()
    assert width is not None and width["width"] >= 1400 - 80, width
    page.screenshot(path=str(ARTIFACTS / "training-trace.png"), full_page=True)
