"""`evagg status` says each sink's health as a word a user acts on, and the agent's log
names where a failed delivery went and when it is tried again (issue 16, item 5)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg
from tests.aggregator.stopping import spool_events, wait_for
from tests.ports import free_port
from tests.producers import producer_report, start_producer
from tests.sinks.server_thread import ServerThread


class Refusing(BaseHTTPRequestHandler):
    """An endpoint whose credentials are always wrong."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def refusing_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ingest"
    server.shutdown()
    server.server_close()


def http_sink(url: str) -> str:
    return f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{url}"\n'


def status_line(agent: AgentProcess, sink: str) -> str:
    result = evagg("status", "--url", agent.http_url, "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith(f"sink {sink}"))


def test_a_sink_that_cannot_connect_is_retrying_since_its_first_failure(
        agent_factory: Callable[..., AgentProcess]) -> None:
    url = f"http://127.0.0.1:{free_port()}/ingest"  # nothing listens there
    agent = agent_factory(sinks_toml=http_sink(url)).start()
    spool_events(agent, 20, "collector")
    wait_for(lambda: "retrying (connect)" in status_line(agent, "collector"),
             "retrying (connect) in status", agent)
    line = status_line(agent, "collector")
    assert re.search(r"retrying \(connect\) since \d\d:\d\d:\d\d UTC, (next in \d+s|retrying now)",
                     line), line
    assert not line.endswith(" ok")
    failed = next(row for row in agent.log().splitlines() if "sink collector failed" in row)
    assert url in failed and re.search(r"next retry (in \d+\.\ds|at once)", failed), failed


def test_a_sink_with_wrong_credentials_is_failing(
        agent_factory: Callable[..., AgentProcess], refusing_url: str) -> None:
    agent = agent_factory(sinks_toml=http_sink(refusing_url)).start()
    spool_events(agent, 5, "collector")
    wait_for(lambda: "failing" in status_line(agent, "collector"), "failing in status", agent)
    assert "failing (http_auth) since " in status_line(agent, "collector")
    failed = next(row for row in agent.log().splitlines() if "sink collector failed" in row)
    assert "(http_auth)" in failed and "a permanent error" in failed


def test_a_delivering_sink_is_ok(agent: AgentProcess) -> None:
    spool_events(agent, 5, "lake")
    agent.wait_delivered(5)
    assert status_line(agent, "lake").endswith(" ok")


def test_an_endpoint_that_fails_between_successes_is_not_ok_while_it_fails(
        agent_factory: Callable[..., AgentProcess], servers: Callable[..., ServerThread]) -> None:
    """The sink retries each request itself and tells the delivery loop only after four
    failures in a row: status said `ok` meanwhile (four timeouts: 40 s at the default)."""
    endpoint = servers()
    agent = agent_factory(sinks_toml=http_sink(endpoint.url) + 'timeout = "3s"\n').start()
    assert producer_report(start_producer(agent.socket_path, "before", 5))["flushed"]
    agent.wait_delivered(5, sink="collector")
    assert status_line(agent, "collector").endswith(" ok")
    endpoint.stall(60)  # each request times out, after 3 s
    assert producer_report(start_producer(agent.socket_path, "during", 5))["flushed"]
    seen: list[str] = []

    def retrying() -> bool:
        seen.append(status_line(agent, "collector"))
        return "retrying" in seen[-1]

    wait_for(retrying, "retrying", agent)
    # from the first timeout (3 s in), before the loop hears of it (the fourth, 12 s in)
    assert "retrying (its requests fail) since" in seen[-1], seen
    endpoint.stall(0)
    # ok again, and for five minutes it says what failed meanwhile
    wait_for(lambda: re.search(r" ok, but \d+ of its \d+ requests in the last 5 min failed "
                               r"\(timeout \d+\) and were retried$",
                               status_line(agent, "collector")) is not None, "ok again", agent)


def test_a_lake_directory_that_became_unwritable_is_failing_not_retrying(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    """The lake's directory is swapped for one no one may write (as a remount read-only
    or a mode change would leave it): a permanent error, which the alert on
    evagg_sink_permanent_error sees, not a retry that never ends."""
    real = tmp_path / "real-lake"
    real.mkdir()
    lake = tmp_path / "lake"
    lake.symlink_to(real)
    agent = agent_factory(sinks_toml=f'[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                                     f'url = "{lake}"\nroll_interval = "1s"\n').start()
    lake.unlink()
    lake.symlink_to("/sys/fs")  # mkdir there: EPERM, even for root
    spool_events(agent, 5, "lake")
    wait_for(lambda: "failing (permission)" in status_line(agent, "lake"),
             "failing (permission) in status", agent)
    assert agent.metric('evagg_sink_permanent_error{sink="lake"}') == 1
