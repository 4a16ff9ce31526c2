"""Producers in real processes -> real agent -> spool -> Parquet, read back with DuckDB."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.agentproc import AgentProcess, query_lake
from tests.producers import assert_exactly_once, producer_report, start_producer


def test_several_producers_exactly_once_with_types(agent: AgentProcess) -> None:
    producers = {f"p{n}": start_producer(agent.socket_path, f"p{n}", 5000) for n in range(4)}
    pids = {name: proc.pid for name, proc in producers.items()}
    for proc in producers.values():
        report = producer_report(proc)
        assert report["flushed"] and report["raised"] == 0
    agent.wait_delivered(20_000)
    assert agent.metric('evagg_sink_last_delivery_timestamp_seconds{sink="lake"}') > 1.7e9
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {name: 5000 for name in producers})

    rows = query_lake(
        agent.lake_dir, "SELECT DISTINCT run_id, pid, uid FROM events WHERE kind = 'task'"
    )
    assert {(run, pid) for run, pid, _ in rows} == set(pids.items())
    assert {uid for _, _, uid in rows} == {os.getuid()}
    types = dict(
        query_lake(agent.lake_dir, "SELECT column_name, column_type FROM (DESCRIBE events)")
    )
    assert types["time"] == "TIMESTAMP WITH TIME ZONE"
    assert types["received"] == "TIMESTAMP WITH TIME ZONE"
    assert types["metrics"] == "MAP(VARCHAR, DOUBLE)"
    assert types["attrs"] == "MAP(VARCHAR, VARCHAR)"
    assert types["nonfinite"] == "VARCHAR[]"
    assert types["step"] == "BIGINT" and types["pid"] == "INTEGER"
    ((loss,),) = query_lake(
        agent.lake_dir, "SELECT metrics['loss'] FROM events WHERE task_id = 'p0-3'"
    )
    assert loss == 0.25


def test_kill_9_mid_stream_loses_and_duplicates_nothing(
        agent: AgentProcess, tmp_path: Path) -> None:
    producers, done = live_producers(agent, tmp_path, "k")
    downtimes = []
    for _ in range(2):
        wait_mid_stream(agent, done)
        killed = time.monotonic_ns()
        agent.kill()
        time.sleep(0.5)  # the agent stays down a while: producers emit into their buffers
        agent.start()
        downtimes.append(time.monotonic_ns() - killed)
    reports = [producer_report(proc) for proc in producers.values()]
    for report in reports:
        assert report["raised"] == 0 and report["flushed"]
        # an emit() that waited for the dead agent would take as long as the agent was
        # down (0.5 s and a start, longer on a loaded machine): no emit() took that long
        assert report["slowest_ns"] < min(downtimes), (report, downtimes)
    agent.wait_delivered(1)  # the restarted agent delivers the backlog from the spool
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {name: LIVE_EVENTS for name in producers})


def test_sigterm_mid_stream_and_a_restart_lose_and_double_nothing(
        agent: AgentProcess, tmp_path: Path) -> None:
    """A graceful restart under live traffic (a deploy, `systemctl restart`): the socket
    stops accepting, the frames already read are spooled and acked, the drain ends with
    exit 0, and the producers hand the rest to the next agent, each event once."""
    producers, done = live_producers(agent, tmp_path, "g")
    for _ in range(2):
        wait_mid_stream(agent, done)
        assert agent.stop() == 0
        assert "evagg agent stopped: every spooled event was delivered" in agent.log()
        agent.start()
    for report in map(producer_report, producers.values()):
        assert report["raised"] == 0 and report["flushed"] and not report["dropped"]
    agent.wait_delivered(1)
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {name: LIVE_EVENTS for name in producers})


LIVE_EVENTS = 30_000  # per producer, spread over LIVE_SECONDS: the stops land mid-stream
LIVE_SECONDS = 15  # room for two agent starts on a loaded 2-core machine


def live_producers(agent: AgentProcess, tmp_path: Path, prefix: str,
                   ) -> tuple[dict[str, subprocess.Popen[bytes]], list[Path]]:
    """Three producers emitting all along; each touches its done file after its last event."""
    done = [tmp_path / f"{prefix}{n}.done" for n in range(3)]
    producers = {f"{prefix}{n}": start_producer(agent.socket_path, f"{prefix}{n}", LIVE_EVENTS,
                                                seconds=LIVE_SECONDS, done_file=done[n])
                 for n in range(3)}
    return producers, done


def wait_mid_stream(agent: AgentProcess, done: list[Path], timeout: float = 60.0) -> None:
    """Until this agent has taken a few thousand events of the producers, and checked that
    none of them has emitted its last: a stop after this lands mid-stream."""
    deadline = time.monotonic() + timeout
    while agent.metric('evagg_received_events_total{route="socket"}') < 3000:
        assert time.monotonic() < deadline, f"the agent took no traffic:\n{agent.log()}"
        time.sleep(0.05)
    assert not any(path.exists() for path in done), "a producer ended before the stop"


def wait_for_files(paths: list[Path], procs: list[subprocess.Popen[bytes]],
                   timeout: float = 60.0) -> None:
    """Until every file in `paths` exists; a producer that exits first fails the test."""
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        assert all(proc.poll() is None for proc in procs), "a producer exited early"
        assert time.monotonic() < deadline, f"not all of {paths} after {timeout}s"
        time.sleep(0.05)


def test_agent_appearing_later_receives_buffered_events_and_loss_counts(
    agent_factory: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    agent = agent_factory()
    done = [tmp_path / "late.done", tmp_path / "over.done"]
    small = start_producer(agent.socket_path, "late", 2000, flush_timeout=30, done_file=done[0])
    overflowing = start_producer(
        agent.socket_path, "over", 200_000, flush_timeout=30, buffer_bytes=256 * 1024,
        done_file=done[1],
    )
    wait_for_files(done, [small, overflowing])  # both emitted everything with no agent listening
    agent.start()
    assert producer_report(small)["flushed"]
    producer_report(overflowing)
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {"late": 2000})
    ((delivered,),) = query_lake(
        agent.lake_dir, "SELECT count(*) FROM events WHERE task_id LIKE 'over-%'"
    )
    losses = query_lake(
        agent.lake_dir,
        "SELECT sum(metrics['events']) FROM events WHERE kind = 'loss' AND run_id = 'over'",
    )
    assert delivered < 200_000
    assert losses[0][0] == 200_000 - delivered


def test_sigterm_drains_everything_spooled(agent_factory: Callable[..., AgentProcess]) -> None:
    slow_roll = '[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\nroll_interval = "1h"\n'
    agent = agent_factory(sinks_toml=slow_roll).start()
    assert producer_report(start_producer(agent.socket_path, "d", 3000))["flushed"]
    assert agent.stop() == 0  # the hour-long roll must not hold the data back
    assert_exactly_once(agent.lake_dir, {"d": 3000})
