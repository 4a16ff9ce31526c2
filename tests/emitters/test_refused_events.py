"""An event whose value does not fit its column, sent through the library to a real agent.

The rule is the agent's (docs/event-schema.md, "Bad input"): such an event is refused,
never stored with the column NULL and the text in attrs. The library never raises for
it; it counts the refusal by the agent's reason, and keeps every good event.
"""

from __future__ import annotations

import pytest

from emitters import Emitter
from tests.agentproc import AgentProcess


@pytest.mark.parametrize("frames", ["columns", "ndjson"])
def test_a_bad_value_is_refused_by_the_agent_and_counted_by_its_reason(
        agent: AgentProcess, frames: str) -> None:
    emitter = Emitter(socket=agent.socket_path, frames=frames)
    try:
        emitter.emit(kind="task", name="good", duration_s=0.5)
        emitter.emit(kind="task", name="bad", duration_s="abc")  # no exception here
        assert not emitter.flush(30), "a flush with a refused event must say False"
        stats = emitter.stats()
    finally:
        emitter.close(5.0)
    assert stats.acked == 1 and stats.rejected == 1
    assert stats.refused == {"field 'duration_s' must be a number, got str": 1}
    agent.stop()
    rows = agent.query("SELECT name, duration_s, attrs FROM events WHERE kind = 'task'")
    assert rows == [("good", 0.5, None)]


def test_an_event_refused_alone_is_counted_as_nacked_with_the_reason(
        agent: AgentProcess) -> None:
    emitter = Emitter(socket=agent.socket_path)
    try:
        emitter.emit(kind="op", name="alone", step="x")  # its frame holds nothing else
        assert not emitter.flush(30)
        stats = emitter.stats()
    finally:
        emitter.close(5.0)
    assert stats.dropped == {"nacked": 1}
    assert stats.refused == {"field 'step' must be an integer, got str": 1}
    assert agent.metric('evagg_rejected_events_total{route="socket"}') == 1
