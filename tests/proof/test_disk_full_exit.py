"""A producer exits while the spool's disk is full: every event it emitted is delivered
once the disk has room again, or counted lost, never neither.

The agent used to close a producer's connection when its spool write failed, so the
producer's frames came back only with the producer: one that gave up (its exit
deadline passed) had frames the agent had read and dropped, and counted them nowhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.producers import producer_report, start_producer
from tests.proof import distinct, emitter_losses, task_ids, wait_caught_up
from tests.proof.disk import agent_capped_above_its_disk, fill, tmpfs
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until

EVENTS = 20_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    workdir = tmp_path / "agent"
    with tmpfs(workdir / "state", "24m"):
        yield workdir


def test_a_producer_that_exits_while_the_disk_is_full_loses_nothing_uncounted(
        small_disk: Path) -> None:
    receiver = ServerThread().start()
    receiver.stop()  # nothing is delivered, so the spool frees no room by itself
    agent = agent_capped_above_its_disk(small_disk, receiver,
                                        'batch_interval = "100ms"\nretry_max_backoff = "1s"\n')
    filler = small_disk / "state" / "other-use"
    try:
        fill(filler, leave=256 * 1024)
        producer = start_producer(agent.socket_path, "gone", EVENTS, seconds=1.0,
                                  end="exit", exit_timeout=2.0)
        producer_report(producer)  # it exited, giving up on what was not answered
        wait_until(lambda: agent.metric("evagg_spool_write_failing_since_timestamp_seconds")
                   > 0, 30, "the spool's writes to fail")
        filler.unlink()
        receiver.start()
        wait_caught_up(agent, ["collector"], timeout=60)
        assert agent.stop() == 0
        events = distinct(receiver.accepted_events())
    finally:
        agent.kill()
        receiver.close()
    delivered = {task for task in task_ids(events) if task.startswith("gone-")}
    lost_by_producer = emitter_losses(events)["gone"]
    lost_by_agent = sum(int(e["metrics"]["events"]) for e in events
                        if e.get("kind") == "loss"
                        and (e.get("attrs") or {}).get("component") != "emitter")
    assert len(delivered) + lost_by_producer + lost_by_agent == EVENTS, (
        len(delivered), lost_by_producer, lost_by_agent)


def test_producers_that_reconnect_while_the_disk_is_full_hold_one_connection_each(
        small_disk: Path) -> None:
    """With no answer for ack_timeout a producer reconnects and resends: its earlier
    connection, waiting for the disk, is let go, or they pile up one per ack_timeout
    until max_connections refuses new producers."""
    receiver = ServerThread().start()
    receiver.stop()
    agent = agent_capped_above_its_disk(small_disk, receiver)
    filler = small_disk / "state" / "other-use"
    producers = []
    try:
        fill(filler, leave=256 * 1024)
        producers = [start_producer(agent.socket_path, f"r{n}", 50_000, seconds=20.0,
                                    flush_timeout=60, ack_timeout=0.5) for n in range(2)]
        wait_until(lambda: agent.metric("evagg_spool_write_failing_since_timestamp_seconds")
                   > 0, 30, "the spool's writes to fail")
        reconnects = 10  # each producer's, at least: 5 s of ack timeouts
        wait_until(lambda: agent.metric("evagg_connections_total") >= 2 * reconnects, 60,
                   lambda: f"the producers to reconnect:\n{agent.metrics()}")
        assert agent.metric("evagg_open_connections") <= 2 * 2, agent.metrics()
        filler.unlink()
        receiver.start()
        reports = [producer_report(producer) for producer in producers]
        assert all(report["flushed"] for report in reports), reports
        wait_caught_up(agent, ["collector"], timeout=60)
        assert agent.stop() == 0
        events = distinct(receiver.accepted_events())
    finally:
        for producer in producers:
            producer.kill()
        agent.kill()
        receiver.close()
    delivered = [task for task in task_ids(events) if task.startswith("r")]
    assert len(delivered) == len(set(delivered)) == 2 * 50_000


def test_an_agent_stopped_while_the_disk_is_full_counts_each_lost_frame_once(
        small_disk: Path) -> None:
    """A producer that reconnected every ack_timeout and then exited: at the stop, the
    frames it sent and nobody stored are counted lost (unstored_at_stop) once each, not
    once per connection they came on."""
    receiver = ServerThread().start()
    receiver.stop()
    agent = agent_capped_above_its_disk(small_disk, receiver)
    try:
        fill(small_disk / "state" / "other-use", leave=256 * 1024)
        producer = start_producer(agent.socket_path, "once", EVENTS, seconds=1.0,
                                  end="exit", exit_timeout=4.0, ack_timeout=0.5)
        producer_report(producer)
        agent.stop()
    finally:
        agent.kill()
        receiver.close()
    counted = [int(n) for n in re.findall(r"so their (\d+) events are lost", agent.log())]
    assert counted, agent.log()[-3000:]
    assert sum(counted) <= EVENTS, counted
