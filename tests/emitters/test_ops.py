"""`with op(...)`: STARTED then FINISHED/FAILED, paired by task_id and span_id, nested
by parent_id."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest

from emitters import Emitter, current_op
from tests.emitters.fakeagent import FakeAgent, short_socket_path


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(short_socket_path()) as running:
        yield running


@pytest.fixture
def emitter(agent: FakeAgent) -> Iterator[Emitter]:
    made = Emitter(socket=agent.path, flush_interval=0.01, source="trainer", run_id="r1")
    yield made
    made.close(1)


def by_state(events: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    return {e["state"]: e for e in events if e["name"] == name}


def test_op_records_started_then_finished_with_metrics(agent: FakeAgent,
                                                       emitter: Emitter) -> None:
    with emitter.op("train_step", step=12, lr=0.1) as op:
        op.metric(loss=0.25, grad_norm=math.nan)
        op.metric(tokens=4096, overflow=-math.inf)
        op.set(attempt=2, phase="warmup")
    assert emitter.flush(20)
    events = agent.events()
    assert [e["state"] for e in events] == ["STARTED", "FINISHED"]
    started, finished = events
    for event in events:
        assert event["kind"] == "op" and event["name"] == "train_step"
        assert event["source"] == "trainer" and event["run_id"] == "r1"
        assert event["step"] == 12 and event["attrs"]["lr"] == "0.1"
        assert event["task_id"] == event["span_id"] == op.task_id
    assert "duration_s" not in started and "metrics" not in started
    assert 0 <= finished["duration_s"] < 60
    assert finished["time"] >= started["time"]
    assert finished["metrics"] == {"loss": 0.25, "tokens": 4096.0}
    assert finished["nonfinite"] == ["grad_norm", "overflow"]
    assert finished["attempt"] == 2 and finished["attrs"]["phase"] == "warmup"
    assert started["event_id"] != finished["event_id"]


def fail_deep(depth: int) -> None:
    if depth == 0:
        raise KeyError("missing shard")
    fail_deep(depth - 1)


def test_op_failure_records_error_and_reraises_the_same_exception(agent: FakeAgent,
                                                                  emitter: Emitter) -> None:
    with pytest.raises(KeyError) as caught, emitter.op("load", step=3) as op:
        op.metric(rows=10)
        fail_deep(3)
    assert emitter.flush(20)
    failed = by_state(agent.events(), "load")["FAILED"]
    assert failed["error_type"] == "KeyError"
    assert failed["error_message"] == str(caught.value) == "'missing shard'"
    trace = failed["stack_trace"]
    assert trace.startswith("Traceback (most recent call last)")
    assert trace.count("fail_deep") >= 4 and "KeyError: 'missing shard'" in trace
    assert failed["metrics"] == {"rows": 10.0} and failed["duration_s"] >= 0


def test_base_exceptions_are_recorded_and_propagate(agent: FakeAgent, emitter: Emitter) -> None:
    with pytest.raises(KeyboardInterrupt), emitter.op("interrupted"):
        raise KeyboardInterrupt
    assert emitter.flush(20)
    assert by_state(agent.events(), "interrupted")["FAILED"]["error_type"] == "KeyboardInterrupt"


def test_a_huge_traceback_is_cut_in_the_middle(agent: FakeAgent, emitter: Emitter) -> None:
    def recurse(n: int) -> int:
        return recurse(n + 1) + 1

    with pytest.raises(RecursionError), emitter.op("deep"):
        recurse(0)
    with pytest.raises(ValueError), emitter.op("long-message"):
        raise ValueError("x" * 100_000)
    assert emitter.flush(20)
    events = agent.events()
    deep = by_state(events, "deep")["FAILED"]["stack_trace"]
    assert deep.startswith("Traceback") and deep.rstrip().endswith("maximum recursion depth "
                                                                   "exceeded")
    long = by_state(events, "long-message")["FAILED"]
    assert long["error_message"] == "x" * 100_000
    assert long["stack_trace"].startswith("Traceback") and "characters cut" in long["stack_trace"]
    assert len(long["stack_trace"]) <= 32 * 1024 + 100


def test_nested_ops_carry_parent_ids(agent: FakeAgent, emitter: Emitter) -> None:
    assert current_op() is None
    with emitter.op("epoch") as outer:
        assert current_op() is outer
        with emitter.op("step") as inner:
            assert current_op() is inner
        assert current_op() is outer
    assert current_op() is None
    assert emitter.flush(20)
    events = agent.events()
    epoch = by_state(events, "epoch")
    step = by_state(events, "step")
    assert "parent_id" not in epoch["STARTED"]
    assert step["STARTED"]["parent_id"] == step["FINISHED"]["parent_id"] == outer.task_id
    assert step["STARTED"]["task_id"] == step["FINISHED"]["task_id"] == inner.task_id
    assert outer.task_id != inner.task_id


def test_async_ops_nest_per_task(agent: FakeAgent, emitter: Emitter) -> None:
    async def child(n: int) -> None:
        async with emitter.op(f"child{n}") as op:
            await asyncio.sleep(0.01)
            op.metric(n=n)

    async def main() -> str:
        async with emitter.op("parent") as parent:
            await asyncio.gather(child(1), child(2))
            return parent.task_id

    parent_id = asyncio.run(main())
    assert emitter.flush(20)
    events = agent.events()
    for n in (1, 2):
        finished = by_state(events, f"child{n}")["FINISHED"]
        assert finished["parent_id"] == parent_id and finished["metrics"] == {"n": float(n)}
    assert len(events) == 6


def test_ops_pair_up_across_many_steps(agent: FakeAgent, emitter: Emitter) -> None:
    for step in range(200):
        with emitter.op("step", step=step):
            pass
    assert emitter.flush(20)
    events = agent.events()
    pairs: dict[str, list[str]] = {}
    for event in events:
        pairs.setdefault(event["task_id"], []).append(event["state"])
    assert len(pairs) == 200
    assert all(states == ["STARTED", "FINISHED"] for states in pairs.values())
