"""Conservation under faults (the oracle of Vector's conservation tests): every event a
producer handed over reaches the Parquet on S3 exactly once and the HTTP receiver at least
once, while the agent is SIGKILLed and restarted, S3 goes away and comes back, and the
HTTP receiver answers 500s, refuses connections, then recovers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from tests.agentproc import AgentProcess
from tests.producers import assert_exactly_once_on_s3, producer_report, start_producer
from tests.proof import expected_ids, task_ids, wait_caught_up
from tests.sinks.moto_server import MotoS3, aws_env
from tests.sinks.server_thread import ServerThread

PRODUCERS = 3
EVENTS_EACH = 12_000
EMIT_SECONDS = 9.0


@pytest.fixture
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture
def receiver() -> Iterator[ServerThread]:
    server = ServerThread().start()
    yield server
    server.close()


def two_sink_agent(factory: Callable[..., AgentProcess], moto: MotoS3, bucket: str,
                   receiver: ServerThread) -> AgentProcess:
    sinks = (
        '[[sinks]]\nname = "lake"\ntype = "parquet"\n'
        f'url = "s3://{bucket}/lake/"\nendpoint_url = "{moto.endpoint_url}"\n'
        'path_style = true\nroll_interval = "1s"\nmultipart_threshold = "256KiB"\n'
        'retry_max_backoff = "2s"\n\n'
        '[[sinks]]\nname = "collector"\ntype = "http"\n'
        f'url = "{receiver.url}"\nbatch_interval = "200ms"\ntimeout = "2s"\n'
        'retry_max_backoff = "2s"\n'
    )
    agent: AgentProcess = factory(sinks_toml=sinks, env=aws_env())
    return agent


def run_faults(agent: AgentProcess, moto: MotoS3, receiver: ServerThread) -> list[str]:
    """The fault schedule, spread over the producers' emitting time; returns what was done."""
    done: list[str] = []

    def step(pause: float, what: str, action: Callable[[], object]) -> None:
        time.sleep(pause)
        action()
        done.append(what)

    step(1.0, "http answers 500", lambda: receiver.answer_always(500))
    step(1.0, "agent SIGKILL + restart", agent.restart)
    step(0.5, "s3 down", moto.stop)
    step(1.0, "http refuses connections", receiver.stop)
    step(1.0, "agent SIGKILL + restart", agent.restart)
    step(1.0, "s3 back", moto.start)
    def http_back() -> None:
        receiver.start()
        receiver.answer_always(200)

    step(0.5, "http back, answering 200", http_back)
    step(1.0, "agent SIGKILL + restart", agent.restart)
    return done


def test_every_event_once_on_s3_and_at_least_once_over_http_through_faults(
        agent_factory: Callable[..., AgentProcess], moto: MotoS3,
        receiver: ServerThread) -> None:
    bucket = moto.create_bucket()
    agent = two_sink_agent(agent_factory, moto, bucket, receiver).start()
    counts = {f"c{n}": EVENTS_EACH for n in range(PRODUCERS)}
    producers = [start_producer(agent.socket_path, prefix, count, seconds=EMIT_SECONDS,
                                flush_timeout=90, frames="columns")
                 for prefix, count in counts.items()]
    try:
        faults = run_faults(agent, moto, receiver)
    finally:
        if not moto.running:
            moto.start()
    assert len(faults) == 8
    for proc in producers:
        report = producer_report(proc, timeout=120)
        assert report["flushed"] and report["raised"] == 0, report
        assert report["columns_frames"] > 0, report  # the emitter's own frame type

    wait_caught_up(agent, ["lake", "collector"], timeout=90)
    assert agent.stop() == 0

    assert_exactly_once_on_s3(moto, bucket, counts)
    over_http = Counter(task_ids(receiver.accepted_events()))
    missing = expected_ids(counts) - set(over_http)
    assert not missing, f"{len(missing)} never reached the HTTP receiver: {sorted(missing)[:5]}"
    statuses = Counter(receiver.statuses())
    assert statuses[500] > 0, statuses  # the outage did hit delivery
