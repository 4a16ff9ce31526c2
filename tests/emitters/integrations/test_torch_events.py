"""What a training loop under TrainingTracker leaves in a real agent's lake: per step one
forward, backward and optimizer_step op and one train_step, FINISHED, numbered from the
start step, each phase inside its step and in the order it ran (backward starts after
forward ended and ends before the optimizer step starts), ids unique; from the main
thread and from a thread of its own, with a step that raised, and for the model outputs
that carry the backward hook differently (a tensor made by an op, a leaf tensor, a dict).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from emitters.emitter import Emitter
from emitters.torch import TrainingTracker
from tests.agentproc import AgentProcess

STEPS = 12
PHASES = ("forward", "backward", "optimizer_step")
SLACK_US = 2  # the lake keeps microseconds: a start and a duration round apart by < 1 us each


pytestmark = pytest.mark.usefixtures("torch_one_thread")


class Leaf(torch.nn.Module):
    """Returns its parameter itself: an output with no node before it (a leaf)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w


class Named(torch.nn.Module):
    """Returns a dict whose first entry needs no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"ids": torch.arange(3), "y": self.linear(x)}


def make(kind: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model: torch.nn.Module
    if kind == "leaf":
        model = Leaf()
    elif kind == "dict":
        model = Named()
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(emitter: Emitter, run_id: str, kind: str = "mlp", start: int = 0,
          fail_at: int | None = None) -> TrainingTracker:
    model, optimizer = make(kind)
    data = [torch.randn(32, 8) for _ in range(STEPS)]
    try:
        with TrainingTracker(model, optimizer, run_id=run_id, start_step=start,
                             emitter=emitter) as tracker:
            for i, x in enumerate(tracker.wrap(data)):
                out = model(x)
                y = out["y"] if isinstance(out, dict) else out
                loss = (y - 1).pow(2).mean()
                loss.backward()
                if i == fail_at:
                    raise RuntimeError("after backward")
                optimizer.step()
                optimizer.zero_grad()
                tracker.metric(loss=loss)
    except RuntimeError:
        pass
    assert tracker.errors == {}
    return tracker


def ops(agent: AgentProcess, run_id: str, count: int) -> dict[int, dict[str, dict[str, Any]]]:
    rows = agent.wait_rows(
        "SELECT step, name, state, epoch_us(time), duration_s, event_id, source FROM events "
        f"WHERE run_id = '{run_id}' AND kind = 'op' ORDER BY step, name", count)
    assert len(rows) == count
    assert len({r[5] for r in rows}) == count  # ids unique
    assert {r[6] for r in rows} == {"torch"}
    by_step: dict[int, dict[str, dict[str, Any]]] = {}
    for step, name, state, start_us, duration_s, _, _ in rows:
        assert name not in by_step.get(step, {})
        by_step.setdefault(step, {})[name] = {
            "state": state, "start": start_us, "duration_s": duration_s,
            "end": start_us + duration_s * 1e6}
    return by_step


def assert_ordered(step: dict[str, dict[str, Any]], names: tuple[str, ...]) -> None:
    """Each phase inside the train step, one after the other, durations positive."""
    train_step = step["train_step"]
    assert train_step["duration_s"] > 0
    previous_end = train_step["start"]
    for name in names:
        phase = step[name]
        assert phase["duration_s"] > 0, name
        assert phase["start"] >= previous_end - SLACK_US, name
        previous_end = phase["end"]
    assert train_step["end"] >= previous_end - SLACK_US


@pytest.mark.parametrize("kind", ["mlp", "leaf", "dict"])
def test_each_step_has_its_four_ops_in_order(agent: AgentProcess, kind: str) -> None:
    emitter = Emitter(socket=str(agent.socket_path))
    train(emitter, f"run-{kind}", kind, start=100)
    assert emitter.flush(30)
    by_step = ops(agent, f"run-{kind}", 4 * STEPS)
    assert sorted(by_step) == list(range(100, 100 + STEPS))
    for step in by_step.values():
        assert {name: op["state"] for name, op in step.items()} == dict.fromkeys(
            (*PHASES, "train_step"), "FINISHED")
        assert_ordered(step, PHASES)
    emitter.close(1)


def test_a_loop_in_a_thread_beside_one_in_the_main_thread(agent: AgentProcess) -> None:
    emitter = Emitter(socket=str(agent.socket_path))
    threaded: list[TrainingTracker] = []
    worker = threading.Thread(target=lambda: threaded.append(train(emitter, "run-thread")))
    worker.start()
    train(emitter, "run-main")
    worker.join(120)
    assert threaded and threaded[0].current_step == STEPS
    assert emitter.flush(30)
    for run_id in ("run-thread", "run-main"):
        by_step = ops(agent, run_id, 4 * STEPS)
        assert sorted(by_step) == list(range(STEPS))
        for step in by_step.values():
            assert_ordered(step, PHASES)
    emitter.close(1)


def test_a_step_that_raised_after_backward(agent: AgentProcess) -> None:
    emitter = Emitter(socket=str(agent.socket_path))
    tracker = train(emitter, "run-raised", fail_at=5)
    assert tracker.current_step == 6
    assert emitter.flush(30)
    by_step = ops(agent, "run-raised", 4 * 5 + 3)
    assert sorted(by_step) == list(range(6))
    for step in range(5):
        assert_ordered(by_step[step], PHASES)
    failed = by_step[5]
    assert {name: op["state"] for name, op in failed.items()} == {
        "forward": "FINISHED", "backward": "FINISHED", "train_step": "FAILED"}
    assert_ordered(failed, ("forward", "backward"))
    emitter.close(1)
