"""Events carry their values as they were at the call (emitters/snapshot.py): a metrics
dict reused from step to step, a list appended to after the call, a numpy array or a
torch tensor updated in place are recorded with the value they had at emit() or
op.metric(), through a real sender to a peer that speaks the wire protocol."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from emitters import Emitter
from emitters.snapshot import snapshot, snapshot_fields
from tests.emitters.fakeagent import FakeAgent, short_socket_path


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(short_socket_path()) as running:
        yield running


@pytest.fixture
def emitter(agent: FakeAgent) -> Iterator[Emitter]:
    made = Emitter(socket=agent.path, flush_interval=0.5, source="trainer")
    yield made
    made.close(1)


def test_a_reused_metrics_dict_and_a_growing_list_keep_each_calls_values(
        agent: FakeAgent, emitter: Emitter) -> None:
    metrics: dict[str, float] = {}
    tags: list[str] = []
    for step in range(200):  # the sender reads these long after the calls
        metrics["loss"] = float(step)
        tags.append(f"t{step}")
        emitter.emit(kind="op", name="step", step=step, metrics=metrics, tags=tags)
    metrics["loss"] = -1.0
    assert emitter.flush(20)
    events = sorted(agent.events(), key=lambda e: e["step"])
    assert [e["metrics"]["loss"] for e in events] == [float(s) for s in range(200)]
    assert [e["attrs"]["tags"].count('"t') for e in events] == [s + 1 for s in range(200)]


def test_a_tensor_or_array_updated_in_place_keeps_its_value_at_the_call(
        agent: FakeAgent, emitter: Emitter) -> None:
    running, window = torch.zeros(()), np.zeros(2)
    for step in range(50):
        running += 1
        window += 1
        with emitter.op("train_step", step=step) as op:
            op.metric(running=running)
            op.set(window=window)
    assert emitter.flush(20)
    finished = sorted((e for e in agent.events() if e["state"] == "FINISHED"),
                      key=lambda e: e["step"])
    assert [e["metrics"]["running"] for e in finished] == [float(s + 1) for s in range(50)]
    assert [e["attrs"]["window"] for e in finished] == [f"[{s + 1}. {s + 1}.]"
                                                        for s in range(50)]  # its str()


def test_plain_values_pass_untouched_and_odd_ones_never_raise() -> None:
    fields = {"a": 1, "b": "x", "c": None, "d": 1.5, "e": True}
    assert snapshot_fields(dict(fields)) == fields
    loop: dict[str, object] = {}
    loop["self"] = loop  # recursive: copied a few levels, then left as it is
    copied = snapshot(loop)
    assert copied is not loop and isinstance(copied, dict)

    class Broken:
        def __iter__(self) -> Iterator[int]:
            raise RuntimeError("no")

    broken = Broken()
    assert snapshot(broken) is broken
    assert snapshot({1, 2}) == frozenset({1, 2}) and snapshot(bytearray(b"ab")) == b"ab"
