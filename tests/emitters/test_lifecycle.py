"""Emitter.close() and Emitter.stats() against a real Unix-socket peer (fakeagent.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from emitters import Emitter, EmitterStats
from tests.emitters.fakeagent import FakeAgent

# A guard against a hang, far beyond any timeout given to close() below: the tests check
# that close() returns, not how fast.
HANG_GUARD_S = 60.0


def accounted(stats: EmitterStats) -> int:
    """Where the emitted events went: each is in exactly one of these."""
    return stats.acked + stats.rejected + sum(stats.dropped.values()) + stats.pending


def close_in_thread(emitter: Emitter, timeout_s: float | None = None) -> bool | None:
    """close() from another thread; None if it did not return within HANG_GUARD_S."""
    outcome: list[bool] = []
    closer = threading.Thread(target=lambda: outcome.append(emitter.close(timeout_s)))
    closer.start()
    closer.join(HANG_GUARD_S)
    return outcome[0] if outcome else None


def test_stats_follow_a_real_exchange(sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    assert emitter.stats() == EmitterStats()  # nothing emitted, no thread started
    with FakeAgent(sock_path) as agent:
        for i in range(50):
            emitter.emit(kind="task", name="load", task_id=str(i))
        with emitter.op("train_step", step=1):  # two events: STARTED and FINISHED
            pass
        assert emitter.flush(20)
        stats = emitter.stats()
        assert len(agent.events()) == 52
    assert (stats.emitted, stats.sent, stats.acked, stats.pending) == (52, 52, 52, 0)
    assert stats.rejected == 0 and stats.dropped == {}
    assert stats.connected and not stats.closed
    assert stats.counters["acked_frames"] == stats.counters["sent_frames"] >= 1
    assert emitter.close(1.0)
    closed = emitter.stats()
    assert closed.closed and not closed.connected and closed.acked == 52


def test_stats_before_an_agent_listens_count_events_as_pending(sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    try:
        for i in range(20):
            emitter.emit(kind="task", name="early", task_id=str(i))
        assert not emitter.flush(0.2)
        waiting = emitter.stats()
        assert (waiting.emitted, waiting.pending, waiting.acked) == (20, 20, 0)
        assert not waiting.connected and waiting.counters["connect_failures"] >= 1
        with FakeAgent(sock_path):
            assert emitter.flush(20)
            delivered = emitter.stats()
    finally:
        emitter.close(1.0)
    assert (delivered.emitted, delivered.acked, delivered.pending) == (20, 20, 0)


def test_drops_and_rejections_each_count_once_and_loss_reports_are_not_events(
        sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01, max_pending=10)
    try:
        # One call, as the OTel exporter makes them: the queue takes 10, 20 are dropped.
        emitter.enqueue_built([{"event_id": f"e{i}", "kind": "task", "name": "flood"}
                               for i in range(30)])
        with FakeAgent(sock_path, reject=lambda b: (1, "event 0: bad time")) as agent:
            assert agent.wait_for(lambda: any(e["kind"] == "loss" for e in agent.events()))
            emitter.flush(20)
            emitter.emit(kind="task", name="after")
            emitter.flush(20)
            stats = emitter.stats()
    finally:
        emitter.close(1.0)
    assert stats.emitted == 31 and stats.pending == 0
    assert stats.dropped["buffer_full"] == 20
    assert stats.rejected >= 1  # one event of each frame, the agent's own choice here
    assert stats.counters["loss_events"] >= 1  # reported to the agent, but not emitted
    assert accounted(stats) == stats.emitted


def test_close_then_emit_drops_and_counts_and_never_raises(sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    with FakeAgent(sock_path) as agent:
        emitter.emit(kind="task", name="in-time")
        assert emitter.close(5.0)
        emitter.emit(kind="task", name="late")
        with emitter.op("late-op"):
            pass
        emitter.enqueue_built([{"event_id": "x", "kind": "span"}])
        assert not emitter.flush(0.1)
        assert emitter.close(0.1)  # a second close only repeats the first one's answer
        assert [e["name"] for e in agent.events()] == ["in-time"]
    stats = emitter.stats()
    assert stats.dropped == {"closed": 4}
    assert (stats.emitted, stats.acked, stats.pending) == (5, 1, 0)
    assert accounted(stats) == stats.emitted


def test_close_with_no_agent_gives_up_instead_of_waiting_out_its_timeout(
        sock_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    for i in range(10):
        emitter.emit(kind="task", name="lost", task_id=str(i))
    assert close_in_thread(emitter, timeout_s=10 * HANG_GUARD_S) is False
    stats = emitter.stats()
    assert stats.dropped == {"exit_deadline": 10} and stats.pending == 0 and stats.closed
    assert "10 event(s) not acknowledged before closing" in caplog.text
    assert "may have stored" not in caplog.text  # none was sent: no agent


def test_close_with_a_silent_agent_returns_at_its_timeout(
        sock_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    with FakeAgent(sock_path, silent_connections=100) as agent:
        emitter.emit(kind="task", name="never-acked")
        assert agent.wait_for(lambda: len(agent.received) == 1)
        assert close_in_thread(emitter, timeout_s=0.3) is False
    stats = emitter.stats()
    assert (stats.emitted, stats.sent, stats.acked) == (1, 1, 0)
    assert stats.dropped == {"exit_deadline": 1}
    # sent, never answered: a full spool holds the answer back, so it may be stored
    assert ("1 event(s) not acknowledged before closing" in caplog.text
            and "1 of them were sent and the agent may have stored them" in caplog.text)
