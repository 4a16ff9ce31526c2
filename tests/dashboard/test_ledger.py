"""The request ledger through `evagg query ledger` and the dashboard's /api/ledger, over
requests recorded by emitters.queueing through a real agent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dashboard.lake.store import Store, StoreOptions
from emitters import Emitter
from tests.agentproc import AgentProcess
from tests.commands import evagg
from tests.dashboard.serve import serving
from tests.emitters.integrations.queue_requests import scripted_run, wait_for_rows


@pytest.fixture(scope="module")
def ledger_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    agent = AgentProcess(tmp_path_factory.mktemp("ledger-agent")).start()
    try:
        emitter = Emitter(socket=str(agent.socket_path), run_id="ledger-run")
        scripted_run(emitter)
        assert emitter.flush(10)
        wait_for_rows(agent, "run_id IN ('ledger-run', 'other-run')", 29)
    finally:
        agent.stop()
    return agent.lake_dir


def test_query_ledger_counts_and_lists_outstanding(ledger_lake: Path) -> None:
    counts = evagg("query", "--data", str(ledger_lake), "--json", "ledger", "--run",
                   "ledger-run", "--outstanding-after", "0s")
    assert counts.returncode == 0, counts.stderr
    (row,) = json.loads(counts.stdout)
    assert {k: row[k] for k in ("enqueued", "started", "answered", "failed", "outstanding")} \
        == {"enqueued": 6, "started": 5, "answered": 3, "failed": 1, "outstanding": 2}
    listed = evagg("query", "--data", str(ledger_lake), "--json", "ledger", "--run",
                   "ledger-run", "--outstanding-after", "0s", "--list")
    assert [r["request_id"] for r in json.loads(listed.stdout)] == ["q4", "q5"]


def test_query_ledger_bad_input_and_unknown_run(ledger_lake: Path) -> None:
    bad = evagg("query", "--data", str(ledger_lake), "ledger", "--run", "ledger-run",
                "--outstanding-after", "soon")
    assert bad.returncode == 2 and "--outstanding-after" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = evagg("query", "--data", str(ledger_lake), "ledger", "--run", "no-such-run")
    assert missing.returncode == 1 and "no requests for run 'no-such-run'" in missing.stderr


def test_api_ledger(ledger_lake: Path) -> None:
    store = Store(StoreOptions(location=str(ledger_lake)))
    try:
        with serving(store) as base:
            with urllib.request.urlopen(
                    f"{base}/api/ledger?run=ledger-run&outstanding_after=0s") as answer:
                body = json.loads(answer.read())
            (summary,) = body["summary"]["rows"]
            assert (summary["answered"], summary["outstanding"]) == (3, 2)
            assert [r["request_id"] for r in body["outstanding"]["rows"]] == ["q4", "q5"]
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}/api/ledger?run=ledger-run&drop=1")
            assert refused.value.code == 400
    finally:
        store.close()
