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


def test_kill_9_mid_stream_loses_and_duplicates_nothing(agent: AgentProcess) -> None:
    producers = {
        f"k{n}": start_producer(agent.socket_path, f"k{n}", 20_000, seconds=4) for n in range(3)
    }
    for _ in range(2):
        time.sleep(1.2)
        agent.kill()
        time.sleep(0.5)  # producers keep emitting into their buffers meanwhile
        agent.start()
    reports = [producer_report(proc) for proc in producers.values()]
    for report in reports:
        assert report["raised"] == 0 and report["flushed"]
        # a producer call that waited for the dead agent would take seconds
        assert report["slowest_ns"] < 1e9
    agent.wait_delivered(1)  # the restarted agent delivers the backlog from the spool
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {name: 20_000 for name in producers})


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
