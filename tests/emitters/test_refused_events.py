"""An event whose value does not fit its column, sent through the library to a real agent.

The rule is the agent's (docs/event-schema.md, "Bad input"): such an event is refused,
never stored with the column NULL and the text in attrs. The library never raises for
it; it counts the refusal by the agent's reason, and keeps every good event.
"""

from __future__ import annotations

import pytest

from emitters import Emitter
from tests.agentproc import AgentProcess
from tests.commands import evagg


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
    # refused in a frame with the good event or alone in one: rejected either way
    assert stats.acked == 1 and stats.rejected == 1 and not stats.dropped
    assert stats.refused == {"field 'duration_s' must be a number, got str": 1}
    agent.stop()
    rows = agent.query("SELECT name, duration_s, attrs FROM events WHERE kind = 'task'")
    assert rows == [("good", 0.5, None)]


@pytest.mark.parametrize("frames", ["columns", "ndjson"])
def test_the_log_names_the_refused_call(agent: AgentProcess, frames: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    # "event 2" counts within a frame of many emit() calls: the log names the event
    emitter = Emitter(socket=agent.socket_path, frames=frames)
    try:
        with caplog.at_level("WARNING", logger="evagg"):
            for n in range(3):
                emitter.emit(kind="task", name=f"good{n}", duration_s=0.5)
            emitter.emit(kind="task", name="lib_bad_dur", duration_s="abc")
            assert not emitter.flush(30)
    finally:
        emitter.close(5.0)
    said = [r.getMessage() for r in caplog.records if "evagg agent re" in r.getMessage()]
    assert len(said) == 1, said
    assert ("(task 'lib_bad_dur'): field 'duration_s' must be a number, got str"
            in said[0]), said


def test_an_event_refused_alone_is_rejected_as_in_company_not_lost(
        agent: AgentProcess) -> None:
    """A frame of bad events only is NACKed; they are still rejected events, not lost
    ones: counted once, on `evagg status`'s rejected line, not on its lost line too."""
    emitter = Emitter(socket=agent.socket_path)
    try:
        emitter.emit(kind="op", name="alone", step="x")  # its frame holds nothing else
        assert not emitter.flush(30)
        stats = emitter.stats()
    finally:
        emitter.close(5.0)
    assert stats.dropped == {} and stats.rejected == 1
    assert stats.refused == {"field 'step' must be an integer, got str": 1}
    assert agent.metric('evagg_rejected_events_total{route="socket"}') == 1
    status = evagg("status", "--url", agent.http_url, "--interval", "0.2")
    assert status.returncode == 0, status.stderr
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
    assert lines["lost"].split()[1:] == ["none"], status.stdout
    assert lines["rejected"].split()[1:] == ["socket=1"], status.stdout


def test_each_refused_event_of_a_frame_counts_under_its_own_reason(
        agent: AgentProcess) -> None:
    emitter = Emitter(socket=agent.socket_path)
    try:
        emitter.emit(kind="task", name="good")
        emitter.emit(kind="task", name="bad-duration", duration_s="abc")
        emitter.emit(kind="task", name="bad-step", step=True)
        emitter.emit(kind="task", name="bad-metric", metrics={"loss": "high"})
        assert not emitter.flush(30)
        stats = emitter.stats()
    finally:
        emitter.close(5.0)
    assert stats.acked == 1 and stats.rejected + stats.dropped.get("nacked", 0) == 3
    assert stats.refused == {"field 'duration_s' must be a number, got str": 1,
                             "field 'step' must be an integer, got bool": 1,
                             "metric 'loss' must be a number, got str": 1}
