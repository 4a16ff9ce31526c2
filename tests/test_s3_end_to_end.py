"""Producers -> real agent -> Parquet on S3 (a real moto server), read back with DuckDB.

The S3 endpoint goes away mid-run, and the agent is killed mid-upload: every event must
still land exactly once, with no multipart upload left behind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from tests.agentproc import AgentProcess
from tests.producers import assert_exactly_once_on_s3, producer_report, start_producer
from tests.sinks.moto_server import MotoS3, aws_env
from tests.waiting import wait_for, wait_until


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


def s3_agent(factory: Callable[..., AgentProcess], moto: MotoS3, bucket: str,
             multipart_threshold: str = "64MiB") -> AgentProcess:
    sinks = ('[[sinks]]\nname = "lake"\ntype = "parquet"\n'
             f'url = "s3://{bucket}/lake/"\nendpoint_url = "{moto.endpoint_url}"\n'
             f'path_style = true\nroll_interval = "1s"\nretry_max_backoff = "2s"\n'
             f'multipart_threshold = "{multipart_threshold}"\n')
    agent: AgentProcess = factory(sinks_toml=sinks, env=aws_env())
    return agent


def delivery_errors(agent: AgentProcess) -> dict[str, float]:
    """evagg_delivery_errors_total of the lake sink, by kind."""
    found: dict[str, float] = {}
    for line in agent.metrics().splitlines():
        if line.startswith("evagg_delivery_errors_total{") and 'sink="lake"' in line:
            kind = re.search(r'kind="([^"]*)"', line)
            found[kind.group(1) if kind else ""] = float(line.rsplit(" ", 1)[1])
    return found


def test_s3_outage_mid_run_loses_and_duplicates_nothing(
        agent_factory: Callable[..., AgentProcess], moto: MotoS3) -> None:
    bucket = moto.create_bucket()
    agent = s3_agent(agent_factory, moto, bucket, multipart_threshold="1KiB").start()
    producers = {f"o{n}": start_producer(agent.socket_path, f"o{n}", 20_000, seconds=6)
                 for n in range(3)}
    # mid-run: files are on S3 already, and the producers go on sending through the outage
    delivered = 'evagg_delivered_events_total{sink="lake"}'
    wait_until(lambda: agent.metric(delivered) > 0, 60, "a first file on S3")
    received = 'evagg_received_events_total{route="socket"}'
    moto.stop()  # uploads in flight fail, their aborts fail too
    try:
        at_outage = agent.metric(received)
        wait_until(lambda: sum(delivery_errors(agent).values()) > 0, 60,
                   "an upload to meet the outage")
        wait_until(lambda: agent.metric(received) >= at_outage + 1000, 60,
                   "the producers to carry on into the outage")
    finally:
        moto.start()  # same port, same buckets
    for proc in producers.values():
        report = producer_report(proc)
        assert report["flushed"] and report["raised"] == 0
    agent.wait_delivered(60_000, timeout=90)
    assert agent.stop() == 0
    assert_exactly_once_on_s3(moto, bucket, {name: 20_000 for name in producers})


def test_agent_killed_mid_upload_rewrites_the_same_key(
        agent_factory: Callable[..., AgentProcess], moto: MotoS3) -> None:
    bucket = moto.create_bucket()
    agent = s3_agent(agent_factory, moto, bucket, multipart_threshold="1KiB").start()
    moto.part_delay_s = 3.0  # every part upload hangs: the kill lands inside one
    try:
        assert producer_report(start_producer(agent.socket_path, "k", 5000))["flushed"]
        uploads = wait_for(lambda: moto.open_uploads(bucket), 30, "a multipart upload",
                           interval=0.05)
        orphan = uploads[0]["Key"]
        agent.kill()
    finally:
        moto.part_delay_s = 0.0
    assert orphan not in moto.keys(bucket)
    agent.start()  # its first upload sweeps the orphan, then rewrites the same key
    agent.wait_delivered(5000, timeout=60)
    assert agent.stop() == 0
    assert orphan in moto.keys(bucket)
    assert_exactly_once_on_s3(moto, bucket, {"k": 5000})
