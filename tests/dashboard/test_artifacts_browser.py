"""A run's page in real headless Chromium lists the files the agent shipped for the run,
and its link downloads the very bytes (docs/dashboard.md, "Files")."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson
from playwright.sync_api import expect

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess
from tests.commands import evagg
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving


def post_op(agent: AgentProcess, run_id: str) -> None:
    body = orjson.dumps([{"kind": "op", "name": "train_step", "state": "FINISHED",
                          "run_id": run_id, "step": 1, "duration_s": 0.5}])
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status in (200, 202)


def shipped_trace(agent_factory: Callable[..., AgentProcess], tmp_path: Path, name: str,
                  content: bytes) -> tuple[Path, Store]:
    """A lake where an agent shipped the trace file `name` (run/file) and got one op of
    run exp-42; the store over it."""
    traces = tmp_path / "traces"
    trace = traces / name
    trace.parent.mkdir(parents=True)
    agent = agent_factory(extra_toml=f'[[files]]\npath = "{traces}"\nkind = "torch_trace"\n'
                                     'settle = "1s"\n').start()
    post_op(agent, "exp-42")
    trace.write_bytes(content)
    agent.wait_rows("SELECT kind FROM events WHERE kind IN ('artifact', 'op')", 2, 90)
    assert agent.stop() == 0
    return trace, Store(StoreOptions(str(agent.lake_dir), refresh_s=0.2, cache_dir=None))


def test_the_run_page_links_the_run_s_files(agent_factory: Callable[..., AgentProcess],
                                            tmp_path: Path) -> None:
    trace, store = shipped_trace(agent_factory, tmp_path, "exp-42/host_1.1.pt.trace.json",
                                 b'{"traceEvents": [{"name": "aten::mm", "ph": "X"}]}')
    with serving(store) as url, chromium() as browser, \
            tab(browser, url, width=1400, height=900) as page:
        page.goto("/#/run?run=exp-42")
        link = page.locator("a.artifact-link")
        expect(link).to_have_text("exp-42/host_1.1.pt.trace.json")
        expect(page.locator("table.artifacts tbody tr")).to_contain_text("torch_trace")
        with page.expect_download() as downloading:
            link.click()
        download = downloading.value
        assert download.suggested_filename == "host_1.1.pt.trace.json"
        assert Path(download.path()).read_bytes() == trace.read_bytes()
        page.screenshot(path=str(ARTIFACTS / "run-files.png"), full_page=True)


def test_a_run_with_files_and_no_steps_shows_its_files(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    """A profiler's traces written under a run that sent no ops (trace_handler without a
    tracker): the run's page is its files, not an error."""
    # another run's op beside it: the lake has runs, not this one
    _, store = shipped_trace(agent_factory, tmp_path, "prof-1/host_1.2.pt.trace.json",
                             b'{"traceEvents": []}')
    with serving(store) as url, chromium() as browser, \
            tab(browser, url, width=1280, height=900) as page:
        page.goto("/#/run?run=prof-1")
        expect(page.locator("a.artifact-link")).to_have_text("prof-1/host_1.2.pt.trace.json")
        expect(page.locator("h1")).to_have_text("Run prof-1")
        expect(page.locator("#no-steps-note")).to_contain_text("No steps or ops were sent")
        expect(page.locator(".error-box")).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "run-files-only.png"), full_page=True)
        page.goto("/#/run?run=nothing-at-all")  # neither steps nor files: the error as before
        expect(page.locator(".error-box")).to_contain_text("no steps for run 'nothing-at-all'")
        page.goto("/#/runs")  # listed with the runs that sent ops, its files counted
        row = page.locator("tbody tr", has_text="prof-1")
        expect(row).to_be_visible()
        heads = page.locator("table", has=row).locator("thead th").all_inner_texts()
        cells = dict(zip(heads, row.locator("td").all_inner_texts(), strict=True))
        assert (cells["steps"], cells["ops"], cells["files"]) == ("0", "0", "1"), cells
        row.locator("a", has_text="prof-1").click()
        expect(page.locator("h1")).to_have_text("Run prof-1")
    listed = evagg("query", "runs", "--json", "--data", store.options.location, "--no-cache")
    assert listed.returncode == 0, listed.stderr
    runs = {row["run_id"]: row for row in orjson.loads(listed.stdout)}
    assert (runs["prof-1"]["steps"], runs["prof-1"]["files"]) == (0, 1), runs
    assert (runs["exp-42"]["steps"], runs["exp-42"]["files"]) == (1, 0), runs
