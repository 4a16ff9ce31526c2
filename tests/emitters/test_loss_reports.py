"""Loss reports: what a producer dropped is what the agent counts, however it ends.

The emitter spaces its `loss` reports out (one a second at most); drops made just before
a producer flushes or exits must still reach the agent's counters, which are what users
read in /metrics and `evagg status`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from emitters import Emitter
from tests.agentproc import AgentProcess
from tests.emitters.fakeagent import Batch, FakeAgent, frame_events
from tests.producers import producer_report, start_producer

COUNTED = "evagg_producer_dropped_events_total"


def reported(agent: FakeAgent) -> dict[str, float]:
    totals: dict[str, float] = {}
    for event in agent.events():
        if event["kind"] == "loss":
            totals[event["name"]] = totals.get(event["name"], 0.0) + event["metrics"]["events"]
    return totals


@pytest.mark.parametrize("end", ["flush", "exit"])
def test_drops_right_before_the_end_are_counted_by_the_agent(agent: AgentProcess,
                                                             end: str) -> None:
    # A queue of 64 takes a burst of 50k emit() calls: most are dropped, all within
    # a fraction of a second, so the drops after the first report come just before the end.
    proc = start_producer(agent.socket_path, "burst", 50_000, max_pending=64, end=end,
                          exit_timeout=30)  # a busy machine must not cut the close short
    report = producer_report(proc)
    dropped: dict[str, int] = report["dropped"]
    assert dropped.get("buffer_full", 0) > 0, report
    # The producer has exited: whatever it reported is in the agent's counters by now.
    counted = {reason: agent.metric(f'{COUNTED}{{reason="{reason}"}}') for reason in dropped}
    assert counted == {reason: float(n) for reason, n in dropped.items()}
    assert agent.metric(COUNTED) == sum(dropped.values())


def test_a_nack_that_ends_a_flush_is_reported_before_the_flush_returns(sock_path: Path) -> None:
    def nack_poison(batch: Batch) -> str | None:
        return "poison frame" if b"poison" in batch.payload else None

    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    try:
        with FakeAgent(sock_path, nack=nack_poison) as agent:
            for round_ in (1, 2):  # the second nack comes within the report interval
                emitter.emit(kind="task", name="poison")
                assert not emitter.flush(20)
                # Read at once: the flush waited for the report, no polling needed.
                assert reported(agent) == {"nacked": float(round_)}
    finally:
        emitter.close(1.0)


def test_drops_by_another_thread_do_not_keep_a_flush_going(sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01, max_pending=1)
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            emitter.emit(kind="task", name="flood")

    # Slow acks: every round trip leaves the flooder time to drop more, so a flush that
    # waited for a report of each new drop would never end.
    with FakeAgent(sock_path, ack_delay=0.05) as agent:
        flooder = threading.Thread(target=flood)
        flooder.start()
        try:
            agent.wait_for(lambda: emitter.stats().dropped.get("buffer_full", 0) > 0)
            started = time.monotonic()
            emitter.flush(60)
            # about 1 s here; a flush kept going by each new drop ends only at its 60 s
            # timeout: half of that, no load makes a wrong flush pass or a right one fail
            assert time.monotonic() - started < 30, "the flush waited for drops made after it"
        finally:
            stop.set()
            flooder.join()
            emitter.close(1.0)


def test_a_flush_after_a_drop_with_no_agent_returns_at_once(sock_path: Path) -> None:
    # Nobody listens: there is no one to report the drop to, and the flush says False now.
    emitter = Emitter(socket=sock_path, max_frame_bytes=4096)
    try:
        emitter.emit(kind="task", name="x" * 10_000)  # too large for any frame: dropped
        started = time.monotonic()
        assert not emitter.flush(30)
        # at once is well under 1 s; a flush that waited for the missing agent takes its
        # 30 s timeout: half of that, no load makes a wrong flush pass or a right one fail
        assert time.monotonic() - started < 15, "the flush waited for an agent that is not there"
        assert emitter.stats().dropped.get("too_large") == 1
    finally:
        emitter.close(1.0)


def test_the_last_report_goes_under_a_session_of_its_own(sock_path: Path) -> None:
    """The agent takes a session's highest stored seq for "every frame up to here is
    stored". The last report, numbered after frames the agent has not answered (a spool
    full under `block` holds them), would be stored first and make them look stored:
    it goes under its own session, its loss events naming the emitter's."""
    emitter = Emitter(socket=sock_path, flush_interval=0.01, max_pending=8)
    with FakeAgent(sock_path, silent_connections=1) as agent:  # the first: never answered
        for i in range(2000):
            emitter.emit(kind="task", name="held", step=i)
        assert agent.wait_for(lambda: any(f.count for f in agent.received))
        emitter.close(0.5)

        def frames_and_last_report() -> tuple[list[Batch], Batch | None]:
            """What came, and the loss report under a session not the emitter's: its
            connections are read apart, so the last report need not come last."""
            with agent._lock:
                frames = list(agent.received)
            own = frames[0].session
            return frames, next((frame for frame in frames if frame.session != own and any(
                event["kind"] == "loss" for event in frame_events(frame))), None)

        assert agent.wait_for(lambda: frames_and_last_report()[1] is not None)
        received, last = frames_and_last_report()
    assert last is not None
    own = received[0].session
    assert {frame.session for frame in received if frame is not last} == {own}
    assert last.seq == 1
    assert {event["attrs"]["session"] for event in frame_events(last)} == {own.hex()}
