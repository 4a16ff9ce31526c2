"""A newcomer's agent on the embedded default (no config file, an empty HOME): an event
sent with `evagg emit` is in `evagg query` within 10 s, and `evagg status` says what is
not in a file yet and when the next file closes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import REPO, free_port, short_socket_dir
from tests.aggregator.cli.newcomer import evagg, evagg_command

VISIBLE_WITHIN_S = 10.0  # the promise in docs/queries.md, "Freshness"


@pytest.fixture
def newcomer_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "EVAGG_"))}
    return {**env, "HOME": str(home), "XDG_RUNTIME_DIR": str(short_socket_dir()),
            "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}", "PYTHONPATH": str(REPO)}


@pytest.fixture
def default_agent(newcomer_env: dict[str, str],
                  tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen([*evagg_command(), "run"], cwd=REPO, env=newcomer_env,
                             stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while evagg("status", env=newcomer_env, inherit=False).returncode != 0:
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.3)
    yield agent
    agent.send_signal(signal.SIGTERM)
    agent.wait(60)
    log.close()


def test_an_emitted_task_is_in_query_tasks_within_seconds(
        default_agent: subprocess.Popen[bytes], newcomer_env: dict[str, str]) -> None:
    sent = evagg("emit", "--kind", "task", "--name", "visible_check", "--state", "FINISHED",
                 "--field", 'task_id="vc1"', env=newcomer_env, inherit=False)
    assert sent.returncode == 0, sent.stderr
    emitted_at = time.monotonic()

    status = evagg("status", env=newcomer_env, inherit=False)
    assert status.returncode == 0, status.stderr
    assert "next file" in status.stdout, status.stdout

    while True:
        asked_at = time.monotonic() - emitted_at
        found = evagg("query", "tasks", "--name", "visible_check", env=newcomer_env,
                      inherit=False)
        assert found.returncode == 0 or "no Parquet files" in found.stderr, found.stderr
        if "vc1" in found.stdout:
            break
        assert asked_at < VISIBLE_WITHIN_S, f"not visible after {asked_at:.1f}s:\n{found.stdout}"
        time.sleep(0.5)
    assert asked_at < VISIBLE_WITHIN_S
    assert "FINISHED" in found.stdout


def test_a_dashboard_started_before_any_data_shows_the_task_within_seconds(
        default_agent: subprocess.Popen[bytes], newcomer_env: dict[str, str],
        tmp_path: Path) -> None:
    port = free_port()
    with (tmp_path / "dashboard.log").open("wb") as log:
        dashboard = subprocess.Popen(
            [*evagg_command(), "dashboard", "--listen", f"127.0.0.1:{port}"], cwd=REPO,
            env=newcomer_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        url = f"{base}/api/tasks?name=visible_in_dashboard"
        deadline = time.monotonic() + 60
        while not _answers(f"{base}/api/info"):  # up, with no file in the lake yet
            assert dashboard.poll() is None, (tmp_path / "dashboard.log").read_text()
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.3)
        sent = evagg("emit", "--kind", "task", "--name", "visible_in_dashboard", "--state",
                     "FINISHED", "--field", "task_id=vd1", env=newcomer_env, inherit=False)
        assert sent.returncode == 0, sent.stderr
        emitted_at = time.monotonic()
        while "vd1" not in _answers(url):
            waited = time.monotonic() - emitted_at
            assert waited < VISIBLE_WITHIN_S, f"not on the dashboard after {waited:.1f}s"
            time.sleep(0.5)
    finally:
        dashboard.terminate()
        dashboard.wait(30)


def _answers(url: str) -> str:
    """The body of a 200 answer, or "" while the server is not there or answers otherwise."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return ""
