"""`[agent] http_token_file` on a real agent: every ingest route and the tail need the
bearer token; Ray's route also takes it as ?token= (Ray's exporter cannot send headers),
and no other route does; health and metrics stay open for probes and scrapers; what a
refused request carried is not stored."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import REPO, AgentProcess

TOKEN = "s3cret-token-for-tests"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ray"
RAY_BODY = json.dumps(
    json.loads((FIXTURES / "02_excerpt_task_lifecycle_normal_and_failed.json").read_text())
    ["events"]).encode()
NATIVE_BODY = b'{"kind": "op", "name": "token-test", "state": "FINISHED"}\n'


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    workdir = tmp_path_factory.mktemp("token")
    token_file = workdir / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with AgentProcess(workdir, agent_toml=f'http_token_file = "{token_file}"') as started:
        yield started


def status(agent: AgentProcess, path: str, body: bytes | None = None,
           bearer: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    request = urllib.request.Request(f"{agent.http_url}{path}", data=body, headers=headers,
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/events", NATIVE_BODY), ("/ray/events", RAY_BODY), ("/v1/traces", b"{}"),
    ("/v1/tail", None)])
def test_ingest_routes_and_the_tail_refuse_a_missing_or_wrong_token(
        agent: AgentProcess, path: str, body: bytes | None) -> None:
    assert status(agent, path, body) == 401
    assert status(agent, path, body, bearer="wrong") == 401


def test_the_bearer_token_opens_the_native_route(agent: AgentProcess) -> None:
    assert status(agent, "/v1/events", NATIVE_BODY, bearer=TOKEN) == 200


def test_only_ray_s_route_takes_the_token_in_the_url(agent: AgentProcess) -> None:
    assert status(agent, f"/v1/events?token={TOKEN}", NATIVE_BODY) == 401
    assert status(agent, "/ray/events?token=wrong", RAY_BODY) == 401
    assert status(agent, f"/ray/events?token={TOKEN}", RAY_BODY) == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probes_and_metrics_stay_open(agent: AgentProcess, path: str) -> None:
    assert status(agent, path) == 200


def test_nothing_of_a_refused_request_is_stored(agent: AgentProcess) -> None:
    refusals = 'evagg_bad_input_total{reason="unauthorized",route="/v1/events"}'
    before = agent.metric(refusals)  # the module's other tests refuse requests too
    assert status(agent, "/v1/events", b'{"kind": "op", "name": "refused"}\n') == 401
    assert status(agent, "/v1/events", b'{"kind": "op", "name": "admitted"}\n',
                  bearer=TOKEN) == 200
    names = {n for n, in agent.wait_rows(
        "SELECT name FROM events WHERE name IN ('refused', 'admitted')", 1)}
    assert names == {"admitted"}
    assert agent.metric(refusals) == before + 1  # this request's refusal, counted once


def test_evagg_tail_sends_the_token_from_a_file(agent: AgentProcess, tmp_path: Path) -> None:
    tail = [sys.executable, "-m", "aggregator", "tail", "--url", agent.http_url, "--limit", "1",
            "--kind", "op"]  # not the heartbeat the agent writes meanwhile
    refused = subprocess.run(tail, capture_output=True, text=True, timeout=30, cwd=REPO)
    assert refused.returncode == 2 and "pass --token-file" in refused.stderr
    missing = subprocess.run([*tail, "--token-file", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=30, cwd=REPO)
    assert missing.returncode == 2 and "cannot read the token file" in missing.stderr
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with subprocess.Popen([*tail, "--token-file", str(token_file)], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as follower:
        deadline = time.monotonic() + 20
        while follower.poll() is None and time.monotonic() < deadline:
            assert status(agent, "/v1/events", b'{"kind": "op", "name": "tailed"}\n',
                          bearer=TOKEN) == 200  # until the follower has seen one
            time.sleep(0.3)
        out, err = follower.communicate(timeout=10)
    assert follower.returncode == 0, err
    assert "tailed" in out
