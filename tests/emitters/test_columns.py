"""The emitter's COLUMNS frames as a user sees them: they arrive whole, and an agent that
predates them gets NDJSON from the same emitter, with nothing lost and one warning."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from emitters import Emitter, wire
from tests.emitters.fakeagent import FakeAgent


@pytest.fixture
def emitter(sock_path: Path) -> Iterator[Emitter]:
    made = Emitter(socket=sock_path, flush_interval=0.01, job_id="job-c")
    yield made
    made.close(0.5)


def emit_some(emitter: Emitter, start: int, n: int) -> None:
    for i in range(start, start + n):
        emitter.emit(kind="task", name="work", state="RUNNING", task_id=f"t{i}", step=i,
                     metrics={"loss": 1.0 / (i + 1)}, colour="blue")
        if i % 50 == 0:
            with emitter.op("stage", step=i) as op:
                op.metric(rows=i)


def test_events_arrive_in_columns_frames(sock_path: Path, emitter: Emitter) -> None:
    with FakeAgent(sock_path) as agent:
        emit_some(emitter, 0, 300)
        assert emitter.flush(20)
        frames = list(agent.stored.values())
        events = agent.events()
    assert {type(frame) for frame in frames} == {wire.Columns}
    tasks = [e for e in events if e["kind"] == "task"]
    assert [e["step"] for e in tasks] == list(range(300))
    assert tasks[7] == {**tasks[7], "job_id": "job-c", "source": "evagg",
                        "attrs": {"colour": "blue"}, "metrics": {"loss": 1.0 / 8}}
    assert sum(1 for e in events if e["kind"] == "op") == 12
    assert len({e["event_id"] for e in events}) == len(events)


def test_an_agent_that_refuses_columns_gets_ndjson_and_nothing_is_lost(
        sock_path: Path, emitter: Emitter, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="evagg.emitter")
    with FakeAgent(sock_path, columns=False) as agent:
        emit_some(emitter, 0, 500)
        assert emitter.flush(20)
        emit_some(emitter, 500, 500)  # later events go straight as NDJSON
        assert emitter.flush(20)
        frames = list(agent.stored.values())
        events = agent.events()
        refusals = agent.refused_columns
    assert {type(frame) for frame in frames} == {wire.Batch}
    steps = sorted(e["step"] for e in events if e["kind"] == "task")
    assert steps == list(range(1000))
    assert refusals >= 1  # a second when the emitter's writes outran the first answer
    stats = emitter.stats()
    assert stats.acked == stats.emitted == 1000 + 2 * 20
    assert stats.sent == stats.emitted and not stats.dropped and not stats.pending
    said = [r.getMessage() for r in caplog.records if "COLUMNS" in r.getMessage()]
    assert len(said) == 1 and "sending it NDJSON from now on" in said[0]


def test_frames_ndjson_sends_only_ndjson(sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01, frames="ndjson")
    try:
        with FakeAgent(sock_path) as agent:
            emit_some(emitter, 0, 100)
            assert emitter.flush(20)
            frames = list(agent.stored.values())
    finally:
        emitter.close(0.5)
    assert frames and {type(frame) for frame in frames} == {wire.Batch}
    with pytest.raises(ValueError, match="frames must be 'columns' or 'ndjson'"):
        emitter.configure(frames="arrow")
