"""emitters.torch with real torch on CPU, and a real agent where events must arrive."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from emitters.emitter import Emitter
from emitters.torch import TrainingTracker
from tests.agentproc import AgentProcess

NAN_STEP = 137
START = 1000


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def batches(count: int, nan_at: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for i in range(count):
        x = torch.randn(32, 8)
        if i == nan_at:
            x[0, 0] = math.nan
        yield x, x.sum(dim=1, keepdim=True)


def train(tracker: TrainingTracker, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          steps: int, nan_at: int | None = None) -> None:
    """The usual loop; a non-finite loss skips the update, as loss scalers do."""
    for x, y in tracker.wrap(batches(steps, nan_at)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if not torch.isfinite(loss):
            tracker.metric(loss=loss)
            tracker.step()
            continue
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        tracker.metric(loss=loss, grad_norm=grad_norm, lr=0.01)


def test_nan_loss_is_named_at_its_step_and_steps_continue_from_start(
    agent: AgentProcess,
) -> None:
    emitter = Emitter(socket=str(agent.socket_path), run_id="torch-run")
    model, optimizer = model_and_optimizer()
    tracker = TrainingTracker(model, optimizer, run_id="torch-run", start_step=START,
                              emitter=emitter)
    train(tracker, model, optimizer, 300, nan_at=NAN_STEP)
    tracker.close()
    assert tracker.errors == {}
    assert emitter.flush(30)
    rows = wait_for(agent, "SELECT step, metrics, nonfinite, duration_s, run_id FROM events "
                           "WHERE name = 'train_step' ORDER BY step", 300)
    assert [r[0] for r in rows] == list(range(START, START + 300))
    by_step = {r[0]: r for r in rows}
    bad = by_step[START + NAN_STEP]
    assert bad[2] == ["loss"] and "loss" not in dict(bad[1])
    good = dict(by_step[START + NAN_STEP + 1][1])
    assert good["loss"] > 0 and good["grad_norm"] > 0 and good["lr"] == 0.01
    assert "data_wait_s" in good
    assert all(r[2] is None for s, r in by_step.items() if s != START + NAN_STEP)
    assert {r[4] for r in rows} == {"torch-run"}
    phases = agent.query("SELECT name, count(*), min(duration_s) FROM events "
                         "WHERE source = 'torch' AND name <> 'train_step' GROUP BY name")
    counts = {name: (n, low) for name, n, low in phases}
    assert counts["forward"][0] == 300 and counts["backward"][0] == 299
    assert counts["optimizer_step"][0] == 299
    assert all(low > 0 for _, low in counts.values())
    emitter.close(1)


def wait_for(agent: AgentProcess, sql: str, count: int, timeout: float = 60) -> list[Any]:
    return agent.wait_rows(sql, count, timeout)


class Captured:
    """An emitter stand-in that keeps events: what the tracker hands over, in order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def enqueue_deferred(self, count: int,
                         build: Callable[[], list[dict[str, Any]]]) -> None:
        events = build()
        assert len(events) == count  # the count the tracker queues is what it builds
        self.events += events


def test_no_agent_running_adds_no_exception_and_the_emitter_keeps_or_drops(
    tmp_path: Path,
) -> None:
    emitter = Emitter(socket=str(tmp_path / "nobody.sock"), max_buffer_bytes=64 * 1024)
    model, optimizer = model_and_optimizer()
    tracker = TrainingTracker(model, optimizer, emitter=emitter)
    train(tracker, model, optimizer, 200, nan_at=50)
    tracker.close()
    assert tracker.errors == {} and tracker.current_step == 200
    stats = emitter.stats()
    assert stats.acked == 0 and stats.emitted > 0
    assert emitter.flush(0.2) is False
    emitter.close(0.1)


def test_gradient_accumulation_sums_calls_within_one_step() -> None:
    sink = Captured()
    model, optimizer = model_and_optimizer()
    tracker = TrainingTracker(model, optimizer, emitter=sink)  # type: ignore[arg-type]
    data = list(batches(12))
    for i, (x, y) in enumerate(tracker.wrap(data)):
        torch.nn.functional.mse_loss(model(x), y).backward()
        if i % 3 == 2:
            optimizer.step()
            optimizer.zero_grad()
    tracker.close()
    forwards = [e for e in sink.events if e["name"] == "forward"]
    assert [e["step"] for e in forwards] == [0, 1, 2, 3]
    assert all(e["attrs"] == {"calls": "3"} for e in forwards)
    steps = [e for e in sink.events if e["name"] == "train_step"]
    assert len(steps) == 4 and all(e["duration_s"] > 0 for e in steps)
    assert all(e["metrics"]["data_wait_s"] >= 0 for e in steps)


def test_explicit_steps_without_optimizer_and_bad_metrics_are_counted_not_raised() -> None:
    sink = Captured()
    model, _ = model_and_optimizer()
    tracker = TrainingTracker(model, emitter=sink, start_step=5)  # type: ignore[arg-type]
    for x, _y in batches(3):
        with torch.no_grad():
            out = model(x)
        tracker.metric(mean=out.mean(), vector=out, label="not a number", big=math.inf)
        tracker.step()
    tracker.step()  # an empty step is not emitted and not counted
    tracker.close()
    steps = [e for e in sink.events if e["name"] == "train_step"]
    assert [e["step"] for e in steps] == [5, 6, 7]
    assert all(e["nonfinite"] == ["big"] and "mean" in e["metrics"] for e in steps)
    assert not [e for e in sink.events if e["name"] == "backward"]
    assert sum(tracker.errors.values()) == 6  # vector and label, three times each
    assert tracker.current_step == 8


def test_a_loop_without_a_wrapped_loader_reports_no_data_wait() -> None:
    """Without tracker.wrap(loader) the tracker times no batch wait: a data_wait_s of 0 at
    every step read as a loader that never kept the model waiting, charted flat at 0 us."""
    sink = Captured()
    model, optimizer = model_and_optimizer()
    tracker = TrainingTracker(model, optimizer, emitter=sink)  # type: ignore[arg-type]
    for x, y in batches(3):  # no metric of the caller's either: no metrics at all
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    for x, y in batches(3):  # the caller's metric alone
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        tracker.metric(loss=1.0)
    tracker.close()
    steps = [e for e in sink.events if e["name"] == "train_step"]
    assert [e["step"] for e in steps] == list(range(6))
    assert all("metrics" not in e for e in steps[:3]), steps[:3]
    assert [e["metrics"] for e in steps[3:]] == [{"loss": 1.0}] * 3
    wrapped = Captured()
    tracker = TrainingTracker(model, optimizer, emitter=wrapped)  # type: ignore[arg-type]
    train(tracker, model, optimizer, 3)
    tracker.close()
    assert all(e["metrics"]["data_wait_s"] > 0 for e in wrapped.events
               if e["name"] == "train_step")


def test_the_first_step_starts_at_its_first_batch_not_at_the_tracker() -> None:
    """A checkpoint loaded after the tracker is made was step 0's wall time (2 s against
    0.4 ms for the others), blamed on nobody."""
    import time

    sink = Captured()
    model, optimizer = model_and_optimizer()
    tracker = TrainingTracker(model, optimizer, emitter=sink)  # type: ignore[arg-type]
    time.sleep(0.5)  # loading a checkpoint
    train(tracker, model, optimizer, 3)
    tracker.close()
    steps = [e for e in sink.events if e["name"] == "train_step"]
    assert [e["step"] for e in steps] == [0, 1, 2]
    assert steps[0]["duration_s"] < 0.4, steps[0]


def test_a_step_that_raised_and_was_caught_ends_failed_and_keeps_the_numbering() -> None:
    sink = Captured()
    model, optimizer = model_and_optimizer()
    tracker = TrainingTracker(model, optimizer, emitter=sink)  # type: ignore[arg-type]
    for i, (x, y) in enumerate(tracker.wrap(batches(6))):
        try:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if i == 2:
                raise ValueError("bad batch 2")
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        except ValueError as exc:
            tracker.step(error=exc)  # the loop goes on; the step reads FAILED
    tracker.close()
    steps = [e for e in sink.events if e["name"] == "train_step"]
    assert [e["step"] for e in steps] == [0, 1, 2, 3, 4, 5]
    assert [e["state"] for e in steps] == ["FINISHED"] * 2 + ["FAILED"] + ["FINISHED"] * 3
    assert (steps[2]["error_type"], steps[2]["error_message"]) == ("ValueError", "bad batch 2")
    forwards = [e for e in sink.events if e["name"] == "forward"]
    assert len(forwards) == 6 and all("calls" not in (e.get("attrs") or {}) for e in forwards)


def test_a_callback_that_fails_after_the_graph_fails_backward() -> None:
    """DDP's reducer waits for the gradients' all-reduce in an autograd callback queued
    while the graph runs, and raises there when a rank is gone: backward failed, and
    the tracker's own end-of-backward callback (queued before it) must not call it done."""
    sink = Captured()
    model, optimizer = model_and_optimizer()
    engine = torch.autograd.Variable._execution_engine

    def gone() -> None:
        raise RuntimeError("Connection closed by peer")

    model[0].weight.register_hook(lambda grad: engine.queue_callback(gone))
    with pytest.raises(RuntimeError, match="closed by peer"), \
            TrainingTracker(model, optimizer, emitter=sink):  # type: ignore[arg-type]
        torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.zeros(4, 1)).backward()
    states = {e["name"]: (e["state"], e.get("error_message")) for e in sink.events}
    assert states == {"forward": ("FINISHED", None),
                      "backward": ("FAILED", "Connection closed by peer"),
                      "train_step": ("FAILED", "Connection closed by peer")}


def test_hooks_are_removed_on_close() -> None:
    sink = Captured()
    model, optimizer = model_and_optimizer()
    with TrainingTracker(model, optimizer, emitter=sink):  # type: ignore[arg-type]
        model(torch.randn(2, 8))
    emitted = len(sink.events)
    model(torch.randn(2, 8))
    optimizer.step()
    assert len(sink.events) == emitted
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_module_imports_without_torch() -> None:
    code = ("import sys\nsys.modules['torch'] = None\nimport emitters.torch as t\n"
            "try:\n    t.TrainingTracker()\nexcept ImportError:\n    print('no torch')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no torch"


def test_a_tracker_without_pytorch_installed_says_which_install_adds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets without it
    with pytest.raises(ImportError, match=r"needs PyTorch.*pip install torch.*evagg\[torch\]"):
        TrainingTracker()
