"""Disk pressure: the spool on a 32 MiB tmpfs fills while its only sink (HTTP) is down.

Under each `when_full` policy the agent keeps serving (/healthz 200), producers never
block, and every accepted event is accounted for exactly: delivered, or dropped by the
policy and counted (`evagg_dropped_events_total`, `loss` events). The same with the
filesystem itself full before the byte cap (ENOSPC): the agent must not crash.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProcess
from tests.producers import producer_report, start_producer
from tests.proof import (
    distinct,
    emitter_losses,
    expected_ids,
    http_status,
    metric_where,
    task_ids,
    wait_caught_up,
    wait_until,
)
from tests.proof.disk import filesystem_full, fill, post_events, tmpfs
from tests.sinks.server_thread import ServerThread

FS_SIZE = "32m"
EVENTS_EACH = 40_000
PRODUCERS = 2
EMIT_SECONDS = 3.0


@dataclass
class Pressure:
    agent: AgentProcess
    receiver: ServerThread
    state_dir: Path


@pytest.fixture
def receiver() -> Iterator[ServerThread]:
    server = ServerThread().start()
    yield server
    server.close()


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of FS_SIZE where the agent's state dir (and so its spool) lives."""
    workdir = tmp_path / "agent"
    state = workdir / "state"
    with tmpfs(state, FS_SIZE):
        yield workdir


def pressured_agent(workdir: Path, receiver: ServerThread, spool: str) -> AgentProcess:
    sinks = ('[[sinks]]\nname = "collector"\ntype = "http"\n'
             f'url = "{receiver.url}"\nbatch_interval = "100ms"\ntimeout = "1s"\n'
             'retry_max_backoff = "2s"\n')
    return AgentProcess(workdir, sinks_toml=sinks, agent_toml='max_frame = "1MiB"',
                        spool_toml=f'segment_bytes = "2MiB"\n{spool}')


def metric_sum(snapshot: dict[str, float], name: str) -> float:
    return sum(v for k, v in snapshot.items() if k == name or k.startswith(name + "{"))


def watch_while_filling(agent: AgentProcess, until: Callable[[], bool], cap: int) -> int:
    """Until `until()` holds: /healthz answers 200 and the spool stays under its cap.
    Returns the most spool bytes seen."""
    most = 0

    def check() -> bool:
        nonlocal most
        assert http_status(f"{agent.http_url}/healthz") == 200
        most = max(most, int(agent.metric("evagg_spool_bytes")))
        assert most <= cap
        return bool(until())

    wait_until(check, 60, lambda: f"the spool to fill:\n{agent.metrics()}\n{agent.log()[-3000:]}",
               interval=0.2)
    return most


@dataclass
class Producers:
    counts: dict[str, int]
    procs: list[subprocess.Popen[bytes]]
    done_files: list[Path]  # each touched once its producer's last emit() returned

    def all_emitted(self) -> bool:
        return all(done.exists() for done in self.done_files)


def run_producers(agent: AgentProcess, buffer_bytes: int = 2**20) -> Producers:
    """Producers with small emitter buffers, so a spool that stops taking frames makes
    them drop (and count) within the run."""
    counts = {f"d{n}": EVENTS_EACH for n in range(PRODUCERS)}
    done_files = [agent.workdir / f"{prefix}.emitted" for prefix in counts]
    procs = [start_producer(agent.socket_path, prefix, count, seconds=EMIT_SECONDS,
                            flush_timeout=60, buffer_bytes=buffer_bytes, done_file=done)
             for (prefix, count), done in zip(counts.items(), done_files, strict=True)]
    return Producers(counts, procs, done_files)


def until_emitted(producers: Producers, also: Callable[[], bool]) -> Callable[[], bool]:
    """`also` holds and every producer's last emit() has returned while the sink is down:
    an emit() that waited for the full spool would wait until the sink is back, so the
    producers would never get there (watch_while_filling gives up after 60 s)."""
    return lambda: producers.all_emitted() and also()


def slowest_emit_ms(reports: list[dict[str, Any]]) -> float:
    """The figure a test prints: no test bounds it by the clock, since a loaded machine
    can stop a producer between two lines for as long as it likes."""
    return float(max(report["slowest_ns"] for report in reports)) / 1e6


def assert_segments_collected(agent: AgentProcess) -> None:
    """Recovering from the full spool (or disk) took deleting segments, whose unlinks run
    in the spool's background thread: they happened, and none failed."""
    wait_until(lambda: metric_where(agent, "evagg_spool_totals", total="segments_deleted") > 0,
               30, lambda: f"segments to be collected:\n{agent.metrics()}")
    assert metric_where(agent, "evagg_spool_totals", total="unlink_errors") == 0


def final_heartbeat(events: list[dict[str, Any]]) -> dict[str, float]:
    (last,) = [e for e in events if e.get("kind") == "agent" and e.get("state") == "STOPPING"]
    metrics: dict[str, float] = last["metrics"]
    return metrics


def agent_losses(events: list[dict[str, Any]], reason: str) -> int:
    return sum(int(e["metrics"]["events"]) for e in distinct(events)
               if e.get("kind") == "loss" and e.get("name") == reason
               and (e.get("attrs") or {}).get("component") != "emitter")


def assert_spooled_equals_delivered_plus_dropped(events: list[dict[str, Any]]) -> int:
    """The final heartbeat's counters: every spooled event is delivered or counted dropped.

    The STOPPING heartbeat carries the counters as they were just before it; it and the
    loss rows written with it are spooled after that snapshot."""
    snapshot = final_heartbeat(events)
    stopping = next(e for e in distinct(events) if e.get("kind") == "agent"
                    and e.get("state") == "STOPPING")
    written_with_it = [e for e in distinct(events) if e.get("kind") == "loss"
                       and e.get("received") == stopping.get("received")]
    spooled = metric_sum(snapshot, "evagg_received_events_total") + 1 + len(written_with_it)
    dropped = metric_sum(snapshot, "evagg_dropped_events_total") + sum(
        int(e["metrics"]["events"]) for e in written_with_it)
    delivered = len(distinct(events))
    assert spooled == delivered + dropped, (spooled, delivered, dropped)
    return int(dropped)


def test_block_policy_stops_reading_and_emitters_count_their_drops(
        small_state: Path, receiver: ServerThread) -> None:
    receiver.stop()  # connections refused: the only sink cannot deliver
    agent = pressured_agent(small_state, receiver, 'max_bytes = "8MiB"\nwhen_full = "block"')
    agent.start()
    try:
        producers = run_producers(agent)
        counts, procs = producers.counts, producers.procs
        cap = 8 * 2**20
        most = watch_while_filling(agent, until_emitted(
            producers, lambda: agent.metric("evagg_spool_bytes") > cap - 2**21), cap)
        assert most > cap - 2**21
        assert all(proc.poll() is None for proc in procs)  # past every emit(), flushing
        receiver.start()
        reports = [producer_report(proc) for proc in procs]
        wait_caught_up(agent, ["collector"], timeout=60)
        assert_segments_collected(agent)
        assert agent.stop() == 0
    finally:
        agent.kill()
    print(f"\nslowest emit() {slowest_emit_ms(reports):.1f} ms, the spool full all along")
    for report in reports:
        assert report["raised"] == 0, report
    events = receiver.accepted_events()
    assert assert_spooled_equals_delivered_plus_dropped(events) == 0  # block never drops
    received = Counter(task_ids(events))
    dropped = emitter_losses(events)
    assert sum(dropped.values()) > 0, "the emitters never had to drop: the spool was not full"
    for prefix, count in counts.items():
        got = {t for t in received if t.startswith(f"{prefix}-")}
        assert got <= expected_ids({prefix: count})
        assert len(got) + dropped[prefix] == count, (prefix, len(got), dropped[prefix])


def test_drop_oldest_policy_drops_counted_and_reported_as_loss_events(
        small_state: Path, receiver: ServerThread) -> None:
    receiver.answer_always(503)
    receiver.stall(30)  # each POST hangs past the sink's 1 s timeout
    agent = pressured_agent(small_state, receiver, 'max_bytes = "8MiB"\nwhen_full = "drop_oldest"')
    agent.start()
    try:
        producers = run_producers(agent, buffer_bytes=64 * 2**20)
        counts, procs = producers.counts, producers.procs
        cap = 8 * 2**20
        watch_while_filling(agent,
                            lambda: agent.metric("evagg_dropped_events_total") > 0, cap)
        reports = [producer_report(proc) for proc in procs]
        receiver.stall(0)
        receiver.answer_always(200)
        wait_caught_up(agent, ["collector"], timeout=60)
        assert agent.stop() == 0
    finally:
        agent.kill()
    # Every emit() returned and every frame was acknowledged while the sink still hung:
    # the agent never stopped taking frames.
    print(f"\nslowest emit() {slowest_emit_ms(reports):.1f} ms, the sink hanging all along")
    for report in reports:
        assert report["flushed"] and report["raised"] == 0, report
    events = receiver.accepted_events()
    dropped = assert_spooled_equals_delivered_plus_dropped(events)
    assert not emitter_losses(events)
    missing = expected_ids(counts) - set(task_ids(events))
    assert 0 < len(missing) <= dropped
    reported = agent_losses(events, "drop_oldest")
    assert 0 < reported <= dropped


def test_filesystem_full_before_the_cap_keeps_the_agent_serving(
        small_state: Path, receiver: ServerThread) -> None:
    receiver.stop()
    # Something else on the disk leaves the spool 6 MiB, far below its 1 GiB cap: appends
    # meet ENOSPC first.
    fill(small_state / "state" / "other-use", leave=6 * 2**20)
    agent = pressured_agent(small_state, receiver, 'max_bytes = "1GiB"\nwhen_full = "block"')
    agent.start()
    try:
        producers = run_producers(agent)
        counts, procs = producers.counts, producers.procs
        watch_while_filling(agent, until_emitted(
            producers, lambda: filesystem_full(small_state / "state")), 2**30)
        assert agent.running, agent.log()[-3000:]
        assert metric_where(agent, "evagg_bad_input_total", route="socket",
                            reason="spool_write_failed") > 0
        status, retry_after = post_events(agent, b'{"kind": "op", "name": "while-full"}\n' * 3000)
        assert (status, retry_after) == (503, "5")  # retryable, not a 500 that clients drop
        receiver.start()
        reports = [producer_report(proc) for proc in procs]
        wait_caught_up(agent, ["collector"], timeout=60)
        assert_segments_collected(agent)
        assert agent.stop() == 0
    finally:
        agent.kill()
    print(f"\nslowest emit() {slowest_emit_ms(reports):.1f} ms, the disk full all along")
    for report in reports:
        assert report["raised"] == 0, report
    events = receiver.accepted_events()
    received = Counter(task_ids(events))
    dropped = emitter_losses(events)
    for prefix, count in counts.items():
        got = {t for t in received if t.startswith(f"{prefix}-")}
        assert len(got) + dropped[prefix] == count, (prefix, len(got), dropped[prefix])
