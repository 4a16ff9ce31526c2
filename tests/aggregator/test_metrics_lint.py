"""`/metrics` as Prometheus's own linter reads it: `promtool check metrics` (Debian's
`prometheus` package) finds nothing to say about a real agent's page, the counters a
producer and a bad body moved included."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path

import emitters
from tests.agentproc import AgentProcess
from tests.waiting import wait_until


def test_promtool_check_metrics_passes_a_real_agents_page(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (the README's test command)"
    agent = AgentProcess(tmp_path).start()
    try:
        emitter = emitters.Emitter(socket=str(agent.socket_path))
        emitter.emit(kind="op", name="rollout", state="FAILED", duration_s=2.0)
        assert emitter.flush(30)
        emitter.close()
        request = urllib.request.Request(f"{agent.http_url}/v1/events", data=b"not json\n",
                                         headers={"Content-Type": "application/x-ndjson"})
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as answer:
            assert answer.code == 400
        wait_until(lambda: agent.metric("evagg_events_total") >= 1, 30, "the op's RED count")
        text = agent.metrics()
    finally:
        agent.stop()
    linted = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr
