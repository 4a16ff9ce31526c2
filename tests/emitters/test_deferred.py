"""Events built in the sender thread (Emitter.enqueue_deferred), as an integration uses it
(emitters.torch queues each training step this way): they reach a real agent's lake as
built, a build that fails costs only its own events, counted as `unencodable`, a batch
that does not fit is dropped whole and counted, and the emitter's figures add up.
"""

from __future__ import annotations

from typing import Any

from emitters import Emitter
from tests.agentproc import AgentProcess


def step(name: str, n: int) -> list[dict[str, Any]]:
    return [{"event_id": f"{name}-{i}", "kind": "op", "source": "torch", "name": name,
             "state": "FINISHED", "time": 1_767_322_800_000_000_000 + i, "step": i}
            for i in range(n)]


def test_deferred_events_reach_the_lake_and_a_failed_build_is_counted(
        agent: AgentProcess) -> None:
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("a step the integration cannot build")

    emitter = Emitter(socket=str(agent.socket_path), flush_interval=0.01)
    try:
        emitter.enqueue_deferred(4, lambda: step("before", 4))
        emitter.enqueue_deferred(3, broken)  # between two good ones
        emitter.emit(kind="op", name="plain")
        emitter.enqueue_deferred(2, lambda: step("after", 2))
        assert emitter.flush(20) is False  # a loss since the last flush
        stats = emitter.stats()
    finally:
        emitter.close(5)
    assert stats.dropped == {"unencodable": 3}
    assert stats.emitted == 10 == stats.acked + sum(stats.dropped.values())
    rows = agent.wait_rows("SELECT name, count(*) FROM events WHERE kind = 'op' "
                           "GROUP BY name ORDER BY name", 3)
    assert rows == [("after", 2), ("before", 4), ("plain", 1)]


def test_a_deferred_batch_that_does_not_fit_is_dropped_whole_and_counted(
        agent: AgentProcess) -> None:
    emitter = Emitter(socket=str(agent.socket_path), flush_interval=0.01, max_pending=5)
    built: list[str] = []

    def build(name: str, n: int) -> Any:
        def make() -> list[dict[str, Any]]:
            built.append(name)
            return step(name, n)
        return make

    try:
        emitter.enqueue_deferred(6, build("too-many", 6))  # more than the queue holds
        emitter.enqueue_deferred(4, build("fits", 4))
        emitter.enqueue_deferred(1, build("last", 1))
        assert emitter.flush(20) is False
        stats = emitter.stats()
    finally:
        emitter.close(5)
    assert built == ["fits", "last"]  # the dropped batch is never built, none of it sent
    assert stats.dropped == {"buffer_full": 6}
    assert stats.emitted == 11 and stats.acked == 5
    rows = agent.wait_rows("SELECT name, count(*) FROM events WHERE kind = 'op' "
                           "GROUP BY name ORDER BY name", 2)
    assert rows == [("fits", 4), ("last", 1)]
