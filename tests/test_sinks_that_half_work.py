"""A sink that half works does not read as healthy in `evagg status`.

Through a real agent and the real `evagg status`: an HTTP endpoint (real aiohttp) that
fails two requests in three and answers the third, which the sink's own retries hide from
the delivery loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.agentproc import AgentProcess, http_sink
from tests.commands import evagg
from tests.producers import producer_report, start_producer
from tests.sinks.flaky_server import RESET, Reply
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until


def sink_line(agent: AgentProcess, sink: str) -> str:
    """The sink's line of `evagg status`, as the operator reads it."""
    status = evagg("status", "--config", str(agent.config_path))
    assert status.returncode == 0, status.stdout + status.stderr
    lines = [line for line in status.stdout.splitlines() if line.startswith(f"sink {sink} ")]
    assert len(lines) == 1, status.stdout
    return lines[0]


def test_an_endpoint_that_fails_two_requests_in_three_is_not_just_ok(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    # 503, a connection dropped before the answer, then 200: over and over. Never four
    # failures in a row, so the sink retries each batch itself and delivers everything.
    endpoint.do(lambda: endpoint.server.rotate([Reply(503), Reply(RESET), Reply(200)]))
    agent = agent_factory(sinks_toml=http_sink("collector", endpoint.url),
                          heartbeat_interval="1h").start()
    assert producer_report(start_producer(agent.socket_path, "flaky", 6000))["flushed"]
    wait_until(lambda: {str(e.get("task_id")) for e in endpoint.accepted_events()
                        if str(e.get("task_id")).startswith("flaky")} >= {
        f"flaky-{i}" for i in range(6000)}, 120, "every event, through the failures")
    line = sink_line(agent, "collector")
    said = re.search(r"ok, but (\d+) of its (\d+) requests in the last 5 min failed "
                     r"\(([^)]*)\) and were retried", line)
    assert said, line
    failed, requests = int(said.group(1)), int(said.group(2))
    assert requests >= failed >= requests // 2, line
    assert {kind.split()[0] for kind in said.group(3).split(", ")} == {"http_5xx", "connect"}

    # the log says so, naming the endpoint and the kinds, and what to look at, once
    assert agent.stop() == 0
    words = [line for line in agent.log().splitlines() if "were retried one by one" in line]
    assert len(words) == 1, agent.log()
    assert endpoint.url in words[0] and "http_5xx" in words[0] and "connect" in words[0]
    assert "Look at the endpoint" in words[0]
