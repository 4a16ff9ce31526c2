"""A sink that half works, or hangs, does not read as healthy in `evagg status`.

Through a real agent and the real `evagg status`: an HTTP endpoint (real aiohttp) that
fails two requests in three and answers the third, which the sink's own retries hide from
the delivery loop; and a Parquet sink on S3 (a real moto server) whose upload is taken
and never answered, which counts no failure until its timeouts end it, over a minute on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from tests.agentproc import AgentProcess, http_sink
from tests.commands import evagg
from tests.producers import producer_report, start_producer
from tests.sinks.flaky_server import RESET, Reply
from tests.sinks.moto_server import MotoS3, aws_env
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
    # Then a quiet second, as between the bursts of a sink that delivers in batches: the
    # rate status shows is the last minute's, which a one-second look does not see.
    delivered = 'evagg_delivered_events_total{sink="collector"}'
    counts = [agent.metric(delivered)]

    def quiet() -> bool:
        counts.append(agent.metric(delivered))
        return counts[-1] == counts[-2]
    wait_until(quiet, 60, "a second with nothing delivered", interval=1.5)
    line = sink_line(agent, "collector")
    said = re.search(r"ok, but (\d+) of its (\d+) requests in the last 5 min failed "
                     r"\(([^)]*)\) and were retried", line)
    assert said, line
    failed, requests = int(said.group(1)), int(said.group(2))
    assert requests >= failed >= requests // 2, line
    assert {kind.split()[0] for kind in said.group(3).split(", ")} == {"http_5xx", "connect"}
    rate = re.search(r"sink collector\s+([\d.,]+) events/s", line)
    assert rate and float(rate.group(1).replace(",", "")) > 0, line

    # the log says so, naming the endpoint and the kinds, and what to look at, once
    assert agent.stop() == 0
    words = [line for line in agent.log().splitlines() if "were retried one by one" in line]
    assert len(words) == 1, agent.log()
    assert endpoint.url in words[0] and "http_5xx" in words[0] and "connect" in words[0]
    assert "Look at the endpoint" in words[0]


@pytest.fixture
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.hang_object_puts(False)  # answer what still waits, then stop
    server.stop()


def test_an_upload_that_hangs_says_since_when_it_runs(
        agent_factory: Callable[..., AgentProcess], moto: MotoS3) -> None:
    bucket = moto.create_bucket()
    agent = agent_factory(sinks_toml=(
        f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "s3://{bucket}/lake/"\n'
        f'endpoint_url = "{moto.endpoint_url}"\npath_style = true\nroll_interval = "1s"\n'),
        env=aws_env(), heartbeat_interval="1h").start()
    started = "evagg_sink_attempt_started_timestamp_seconds{sink=\"lake\"}"
    moto.hang_object_puts()
    assert producer_report(start_producer(agent.socket_path, "hung", 100))["flushed"]
    wait_until(lambda: agent.metric(started) > 0, 60, "an upload under way")
    lines: list[str] = []

    def says_delivering() -> bool:
        lines.append(sink_line(agent, "lake"))
        return "ok, delivering since" in lines[-1]
    wait_until(says_delivering, 40, lambda: f"status lines: {lines}", interval=1.0)
    found = re.search(r"ok, delivering since (\d\d:\d\d:\d\d) UTC \((\d+) s\)", lines[-1])
    assert found and int(found.group(2)) >= 10, lines[-1]

    moto.hang_object_puts(False)  # the store answers: the upload ends, the words go
    agent.wait_delivered(100)
    wait_until(lambda: agent.metric(started) == 0, 60, "the attempt's end")
    assert "delivering since" not in sink_line(agent, "lake")
    assert moto.keys(bucket, "lake/")
