"""The Emitter against a real Unix-socket peer (tests/emitters/fakeagent.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

from emitters import Emitter, wire
from tests.emitters.fakeagent import FakeAgent, frame_events, short_socket_path


@pytest.fixture
def make_emitter(sock_path: Path) -> Iterator[Any]:
    made: list[Emitter] = []

    def make(**options: Any) -> Emitter:
        options.setdefault("socket", sock_path)
        options.setdefault("flush_interval", 0.01)
        emitter = Emitter(**options)
        made.append(emitter)
        return emitter

    yield make
    for emitter in made:
        emitter.close(0.5)


def test_events_arrive_with_typed_fields_context_and_unique_ids(sock_path: Path,
                                                                make_emitter: Any) -> None:
    emitter = make_emitter(job_id="job-1", run_id="run-1", node_id="n1", attrs={"team": "ml"})
    before = time.time_ns()
    with FakeAgent(sock_path) as agent:
        for i in range(500):
            emitter.emit(kind="task", name="load", state="FINISHED", task_id=f"t{i}", step=i,
                         duration_s=0.25, shard=i, metrics={"rows": i, "bad": math.inf})
        assert emitter.flush(20)
        events = agent.events()
    assert [e["task_id"] for e in events] == [f"t{i}" for i in range(500)]
    ids = [e["event_id"] for e in events]
    assert len(set(ids)) == 500
    assert all(uuid.UUID(i).version == 7 for i in ids)
    first = events[7]
    assert before <= first["time"] <= time.time_ns()
    assert first["kind"] == "task" and first["name"] == "load" and first["state"] == "FINISHED"
    assert first["source"] == "evagg"
    assert (first["job_id"], first["run_id"], first["node_id"]) == ("job-1", "run-1", "n1")
    assert first["step"] == 7 and first["duration_s"] == 0.25
    assert first["attrs"] == {"team": "ml", "shard": "7"}
    assert first["metrics"] == {"rows": 7.0} and first["nonfinite"] == ["bad"]
    assert "pid" not in first and "received" not in first


def test_known_fields_are_coerced_where_they_fit(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()
    with FakeAgent(sock_path) as agent:
        emitter.emit(kind=7, name=None, state="RUNNING", duration_s=0.5, task_id=12,
                     pid=99, metrics={"y": True, "gone": None},
                     attrs={"n": 1, "ok": False, "nested": {"b": [1, 2]}, "none": None},
                     nonfinite=("z",), time=10**18)
        assert emitter.flush(20)
        (event,) = agent.events()
    assert event["kind"] == "7" and "name" not in event and event["task_id"] == "12"
    assert event["time"] == 10**18 and "pid" not in event and event["duration_s"] == 0.5
    # a None metric is named in nonfinite, as the agent files a null one
    assert event["metrics"] == {"y": 1.0} and event["nonfinite"] == ["gone", "z"]
    assert event["attrs"] == {"n": "1", "ok": "false", "nested": '{"b":[1,2]}'}


def test_a_value_that_does_not_fit_its_column_is_sent_for_the_agent_to_judge(
        sock_path: Path, make_emitter: Any) -> None:
    # Never moved to attrs with the column left NULL: the agent refuses such an event
    # (tests/emitters/test_refused_events.py shows it with a real agent).
    emitter = make_emitter()
    with FakeAgent(sock_path) as agent:
        emitter.emit(kind="task", step="seven", attempt=2**40, metrics={"x": "high"},
                     duration_s=float("nan"))
        assert emitter.flush(20)
        (event,) = agent.events()
    assert (event["step"], event["attempt"], event["metrics"]) == ("seven", 2**40,
                                                                  {"x": "high"})
    assert event["duration_s"] == "nan"  # JSON has no NaN: its text, which the agent refuses
    assert "attrs" not in event


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class BadFloat:
    def __float__(self) -> float:
        raise ValueError("no float")

    def __index__(self) -> int:
        raise ValueError("no int")


def test_emit_never_raises_on_weird_values(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()
    weird: list[Any] = [Unprintable(), BadFloat(), b"\xff\x00", "\ud800 lone surrogate",
                        {1: object()}, [Unprintable()], 10**400, float("-inf"), {"s": {1, 2}}]
    with FakeAgent(sock_path) as agent:
        for value in weird:
            emitter.emit(kind="weird", name=value, state=value, task_id=value, step=value,
                         duration_s=value, metrics={"m": value}, attrs={"a": value}, other=value)
        emitter.emit(kind="weird", name="\ud800", attrs={"\udc00": "x"})
        emitter.emit(kind=Unprintable(), name=BadFloat(), **{"not an identifier": Unprintable()})
        assert emitter.flush(20)
        events = agent.events()
    assert len(events) == len(weird) + 2
    assert events[0]["attrs"]["other"] == "<unprintable Unprintable>"
    assert events[3]["name"] == "\\ud800 lone surrogate"
    assert events[-1]["kind"] == "<unprintable Unprintable>"
    assert events[-1]["attrs"]["not an identifier"] == "<unprintable Unprintable>"
    assert emitter.stats().dropped.get("unencodable", 0) == 0


class BrokenMapping(Mapping[str, float]):
    def __getitem__(self, key: str) -> float:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("cannot iterate")

    def __len__(self) -> int:
        return 1


class FakeStr:
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return str


def test_an_event_that_cannot_be_built_is_dropped_alone_and_reported(
        sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()
    with FakeAgent(sock_path) as agent:
        emitter.emit(kind="task", name="before")
        emitter.emit(kind="task", name="broken", metrics=BrokenMapping())
        emitter.emit(kind="task", name=FakeStr(), label=FakeStr())
        assert not emitter.flush(20)
        assert agent.wait_for(lambda: any(e["kind"] == "loss" for e in agent.events()))
        events = agent.events()
    assert [e["name"] for e in events if e["kind"] == "task"] == ["before", "<unprintable FakeStr>"]
    assert [(e["name"], e["metrics"]) for e in events if e["kind"] == "loss"] == [
        ("unencodable", {"events": 1.0, "events_total": 1.0})]
    assert emitter.stats().dropped["unencodable"] == 1


def test_no_agent_at_first_then_one_appears(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()
    for i in range(100):
        emitter.emit(kind="task", name="early", task_id=str(i))
    assert not emitter.flush(0.3)
    assert emitter.stats().counters["connect_failures"] >= 1
    with FakeAgent(sock_path) as agent:
        assert emitter.flush(20)
        assert sorted(int(e["task_id"]) for e in agent.events()) == list(range(100))
    stats = emitter.stats()
    assert (stats.emitted, stats.acked, stats.pending) == (100, 100, 0)
    assert stats.counters["unacked_frames"] == 0 and stats.counters["buffered_bytes"] == 0


def test_overflow_is_counted_and_reported_as_a_loss_event(sock_path: Path,
                                                          make_emitter: Any) -> None:
    emitter = make_emitter(max_buffer_bytes=8192, max_frame_bytes=2048, max_pending=200)
    emitted = 3000
    for i in range(emitted):
        emitter.emit(kind="task", name="flood", task_id=str(i), payload="x" * 40)
    assert not emitter.flush(0.3)
    assert emitter.stats().dropped["buffer_full"] > 0
    with FakeAgent(sock_path) as agent:
        agent.wait_for(lambda: any(e["kind"] == "loss" for e in agent.events()))
        assert emitter.flush(20)
        events = agent.events()
        session = agent.received[0].session  # one emitter, one session
    # A busy machine's sender thread may still drop what waited in its queue after the
    # first report: those drops go in a later one.
    dropped = emitter.stats().dropped["buffer_full"]
    losses = [e for e in events if e["kind"] == "loss"]
    delivered = [e for e in events if e["kind"] == "task"]
    for loss in losses:
        assert (loss["source"], loss["name"], loss["state"]) == ("evagg", "buffer_full",
                                                                 "DROPPED")
        assert loss["attrs"] == {"reason": "buffer_full", "session": session.hex(),
                                 "component": "emitter"}
    # each report's count, and the session's total so far (the agent counts by it what
    # it missed)
    assert sum(loss["metrics"]["events"] for loss in losses) == dropped
    assert [loss["metrics"]["events_total"] for loss in losses] == list(
        accumulate(loss["metrics"]["events"] for loss in losses))
    assert len(delivered) + dropped == emitted
    assert len({e["task_id"] for e in delivered}) == len(delivered)


def test_dropped_connection_before_ack_resends_and_dedupes(sock_path: Path,
                                                           make_emitter: Any) -> None:
    emitter = make_emitter()
    with FakeAgent(sock_path, drop_before_ack=2) as agent:
        for i in range(300):
            emitter.emit(kind="task", name="resend", task_id=str(i))
            if i % 100 == 99:
                time.sleep(0.05)  # several frames
        assert emitter.flush(20)
        events = agent.events()
        seen = Counter((b.session, b.seq) for b in agent.received)
    # The first frame was stored twice without an ack, so the agent saw it three times.
    assert agent.duplicates() == 2
    assert seen[(agent.received[0].session, 1)] == 3
    assert sorted(int(e["task_id"]) for e in events) == list(range(300))
    # the resent frame's answer says "stored before" (0, 0): its events count as acked,
    # so the figures add up (a trial found 985 events in no bucket)
    stats = emitter.stats()
    assert (stats.emitted, stats.acked, stats.pending) == (300, 300, 0), stats
    assert emitter.stats().counters["resent_frames"] >= 2
    assert emitter.stats().counters["connects"] >= 3


def test_silent_agent_hits_ack_timeout_then_resends(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter(ack_timeout=1.0)  # the healthy second connection answers well within it
    with FakeAgent(sock_path, silent_connections=1) as agent:
        emitter.emit(kind="task", name="slow")
        assert emitter.flush(20)
        assert [e["name"] for e in agent.events()] == ["slow"]
        assert agent.duplicates() == 1
    assert emitter.stats().counters["ack_timeouts"] == 1


def test_delayed_acks_are_waited_for(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()
    with FakeAgent(sock_path, ack_delay=0.2) as agent:
        for i in range(50):
            emitter.emit(kind="task", name="delayed", task_id=str(i))
        assert emitter.flush(20)
        assert len(agent.events()) == 50
        assert agent.duplicates() == 0


def test_nacked_frame_is_dropped_counted_and_reported(sock_path: Path, make_emitter: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    emitter = make_emitter()

    def nack_poison(batch: wire.Batch) -> str | None:
        return "poison frame" if b"poison" in batch.payload else None

    with FakeAgent(sock_path, nack=nack_poison) as agent, caplog.at_level(logging.WARNING):
        emitter.emit(kind="task", name="poison")
        emitter.emit(kind="task", name="poison")
        assert not emitter.flush(20)
        emitter.emit(kind="task", name="fine")

        def reported() -> float:
            return sum(e["metrics"]["events"] for e in agent.events()
                       if e["kind"] == "loss" and e["name"] == "nacked")

        assert agent.wait_for(lambda: reported() == 2)
        assert emitter.flush(20)
        events = agent.events()
    assert [e["name"] for e in events if e["kind"] == "task"] == ["fine"]
    assert emitter.stats().dropped["nacked"] == 2
    assert caplog.text.count("poison frame") == 1  # rate-limited


def test_sessionless_nack_drops_the_oldest_frame_instead_of_looping(sock_path: Path,
                                                                    make_emitter: Any) -> None:
    emitter = make_emitter(max_frame_bytes=64 * 1024)
    with FakeAgent(sock_path, max_frame_bytes=4096) as agent:
        emitter.emit(kind="task", name="too-big-for-the-agent", blob="x" * 8000)
        assert not emitter.flush(20)
        emitter.emit(kind="task", name="fits")
        assert emitter.flush(20)
        assert [e["name"] for e in agent.events() if e["kind"] == "task"] == ["fits"]
    stats = emitter.stats()
    assert stats.dropped["nacked"] == 1 and stats.counters["nacks"] == 1


def test_rejected_events_are_counted_and_logged_once(sock_path: Path, make_emitter: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    emitter = make_emitter()
    with FakeAgent(sock_path, reject=lambda b: (1, "event 0: bad time")) as agent, \
            caplog.at_level(logging.WARNING, logger="evagg.emitter"):
        for round_ in range(3):
            emitter.emit(kind="task", name=f"r{round_}")
            assert not emitter.flush(20)
        assert len(agent.stored) == 3
    assert emitter.stats().rejected == 3
    notes = [r for r in caplog.records if "bad time" in r.getMessage()]
    assert len(notes) == 1


def test_garbage_reply_reconnects_and_delivers(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()
    with FakeAgent(sock_path, garbage_connections=1) as agent:
        emitter.emit(kind="task", name="after-garbage")
        assert emitter.flush(20)
        assert [e["name"] for e in agent.events()] == ["after-garbage"]
    assert emitter.stats().counters["bad_replies"] == 1


def test_event_larger_than_a_frame_is_dropped_with_a_count(sock_path: Path,
                                                           make_emitter: Any) -> None:
    emitter = make_emitter(max_frame_bytes=4096)
    with FakeAgent(sock_path) as agent:
        emitter.emit(kind="task", name="huge", blob="x" * 10_000)
        emitter.emit(kind="task", name="small")
        assert not emitter.flush(20)
        assert agent.wait_for(lambda: any(e["kind"] == "loss" for e in agent.events()))
        events = agent.events()
    assert [e["name"] for e in events if e["kind"] == "task"] == ["small"]
    assert [(e["name"], e["metrics"]) for e in events if e["kind"] == "loss"] == [
        ("too_large", {"events": 1.0, "events_total": 1.0})]
    assert emitter.stats().dropped["too_large"] == 1
    assert all(len(b.payload) <= 4096 for b in agent.received)


@pytest.mark.parametrize("frames", ["columns", "ndjson"])
def test_frames_respect_the_size_limit_and_counts(sock_path: Path, make_emitter: Any,
                                                  frames: str) -> None:
    emitter = make_emitter(max_frame_bytes=16 * 1024, frames=frames)
    with FakeAgent(sock_path) as agent:
        for i in range(2000):
            emitter.emit(kind="task", name="sized", task_id=str(i))
        assert emitter.flush(20)
        batches = list(agent.stored.values())
    assert len(batches) > 1
    assert all(len(b.payload) + 30 <= 16 * 1024 for b in batches)
    assert all(b.count == len(frame_events(b)) for b in batches)
    assert {type(b) for b in batches} == {wire.Columns if frames == "columns" else wire.Batch}
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))


def test_a_buffer_smaller_than_a_frame_makes_smaller_frames(sock_path: Path,
                                                             make_emitter: Any) -> None:
    emitter = make_emitter(max_buffer_bytes=4096)
    with FakeAgent(sock_path) as agent:
        for i in range(200):
            emitter.emit(kind="task", name="tiny-buffer", task_id=str(i))
        emitter.flush(20)
        assert agent.received and all(len(b.payload) + 30 <= 4096 for b in agent.received)


def test_configure_refuses_unknown_options_and_bad_limits(make_emitter: Any) -> None:
    emitter = make_emitter()
    with pytest.raises(TypeError, match="unknown emitter option"):
        emitter.configure(sockt="/nowhere")
    with pytest.raises(ValueError, match="positive"):
        emitter.configure(flush_interval=0)
    with pytest.raises(ValueError, match="at least 1024"):
        emitter.configure(max_buffer_bytes=100)
    emitter.configure(job_id="job-1")
    emitter.configure(job_id=None)  # None leaves a value as it is
    assert emitter.identity["job_id"] == "job-1"
    before = emitter.exit_timeout
    with pytest.raises(ValueError):  # a call that raises changes nothing, not half
        emitter.configure(exit_timeout=before + 5, max_pending="many")
    assert emitter.exit_timeout == before


def test_flush_with_nothing_emitted_is_true_and_closed_emitter_drops(make_emitter: Any) -> None:
    emitter = make_emitter()
    assert emitter.flush(0.1)
    assert emitter.close(0.1)
    emitter.emit(kind="task", name="late")
    assert emitter.stats().dropped == {"closed": 1}
    assert not emitter.flush(0.1)


def test_emit_from_many_threads_delivers_each_event_once(sock_path: Path,
                                                          make_emitter: Any) -> None:
    emitter = make_emitter()

    def produce(n: int) -> None:
        for i in range(2000):
            emitter.emit(kind="task", name=f"thread{n}", step=i)

    with FakeAgent(sock_path) as agent:
        threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert emitter.flush(20)
        events = agent.events()
    assert len({e["event_id"] for e in events}) == len(events) == 8000
    for n in range(4):  # each thread's events keep their order
        assert [e["step"] for e in events if e["name"] == f"thread{n}"] == list(range(2000))


def test_configuring_another_socket_moves_the_connection(make_emitter: Any) -> None:
    first, second = short_socket_path(), short_socket_path()
    emitter = make_emitter(socket=first)
    with FakeAgent(first) as one, FakeAgent(second) as two:
        emitter.emit(kind="task", name="to-first")
        assert emitter.flush(20)
        emitter.configure(socket=second)  # what is emitted after it goes there, at once
        emitter.emit(kind="task", name="to-second")
        assert emitter.flush(20)
        assert [e["name"] for e in one.events()] == ["to-first"]
        assert [e["name"] for e in two.events()] == ["to-second"]


def test_emit_from_asyncio_tasks(sock_path: Path, make_emitter: Any) -> None:
    emitter = make_emitter()

    async def worker(n: int) -> None:
        for i in range(20):
            emitter.emit(kind="task", name=f"w{n}", step=i)
            await asyncio.sleep(0)

    async def main() -> bool:
        await asyncio.gather(*(worker(n) for n in range(5)))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, emitter.flush, 20.0)

    with FakeAgent(sock_path) as agent:
        assert asyncio.run(main())
        assert Counter(e["name"] for e in agent.events()) == {f"w{n}": 20 for n in range(5)}


def sender_cpu_s(emitter: Emitter) -> float:
    """CPU seconds the emitter's sender thread has used (Linux: its /proc task stat)."""
    assert emitter._sender is not None, "the sender starts with the first emit"
    native_id = emitter._sender._thread.native_id
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def test_idle_sender_without_agent_does_not_spin(make_emitter: Any) -> None:
    emitter = make_emitter(flush_interval=0.05)
    emitter.emit(kind="task", name="nobody-listens")
    time.sleep(0.2)
    before = sender_cpu_s(emitter)
    time.sleep(1.0)
    assert sender_cpu_s(emitter) - before < 0.2  # the sender thread's own, not the process's
    assert 1 <= emitter.stats().counters["connect_failures"] <= 30


def test_agent_on_demand_starts_in_the_sender_thread_not_the_callers(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Starting an agent can take seconds: the first emit() must not wait for it."""
    from emitters import autostart

    callers: list[str] = []
    monkeypatch.setenv("EVAGG_START_AGENT", "1")
    monkeypatch.setattr(autostart, "ensure_agent",
                        lambda *args, **kwargs: callers.append(threading.current_thread().name))
    emitter = Emitter(socket=tmp_path / "none.sock")
    emitter.emit(kind="op", name="first")
    deadline = time.monotonic() + 10
    while not callers and time.monotonic() < deadline:
        time.sleep(0.01)
    emitter.close(0.1)
    assert callers == ["evagg-emitter"]
