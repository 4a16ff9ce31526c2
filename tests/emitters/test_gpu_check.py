"""bench/gpu_check.py on a machine without a GPU: its no-device exit, its checks on rows
built by hand, and its workload, tracker run and Parquet read on CPU with a real agent."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from emitters.emitter import Emitter
from tests.agentproc import AgentProcess

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


gc = load_script()
STEPS = range(gc.START_STEP, gc.START_STEP + 4)
NAN_STEP = STEPS[2]
Rows = list[Any]


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def good_rows(steps: range = STEPS, nan_step: int = NAN_STEP) -> Rows:
    rows: Rows = []
    for step in steps:
        rows += [gc.OpRow(step, phase, 0.002, {}, []) for phase in gc.PHASES]
        loss = {} if step == nan_step else {"loss": 2.3}
        rows.append(gc.OpRow(step, "train_step", 0.01, {"peak_memory_bytes": 3e8, **loss},
                             ["loss"] if step == nan_step else []))
    return rows


def change(rows: Rows, step: int, name: str, **fields: Any) -> Rows:
    return [dataclasses.replace(r, **fields) if (r.step, r.name) == (step, name) else r
            for r in rows]


def drop(rows: Rows, step: int, name: str) -> Rows:
    return [r for r in rows if (r.step, r.name) != (step, name)]


def test_without_cuda_the_script_says_so_and_exits_zero() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no CUDA device: nothing checked"


def test_complete_rows_pass_every_check() -> None:
    assert gc.check_rows(good_rows(), STEPS, NAN_STEP) == []


BROKEN: dict[str, tuple[Callable[[Rows], Rows], str]] = {
    "missing op": (lambda r: drop(r, STEPS[1], "backward"), f"step {STEPS[1]}: no backward op"),
    "zero duration": (lambda r: change(r, STEPS[0], "forward", duration_s=0.0),
                      "forward duration_s 0.0 (want > 0)"),
    "no duration": (lambda r: change(r, STEPS[3], "optimizer_step", duration_s=None),
                    "optimizer_step duration_s None"),
    "missing peak memory": (lambda r: change(r, STEPS[1], "train_step", metrics={"loss": 1.0}),
                            f"step {STEPS[1]}: peak_memory_bytes missing"),
    "zero peak memory": (lambda r: change(r, STEPS[0], "train_step",
                                          metrics={"loss": 1.0, "peak_memory_bytes": 0.0}),
                         "peak_memory_bytes missing or not > 0"),
    "missing nonfinite": (lambda r: change(r, NAN_STEP, "train_step", nonfinite=[]),
                          f"step {NAN_STEP}: NaN loss not named in nonfinite"),
    "NaN stored as a number": (lambda r: change(r, NAN_STEP, "train_step", metrics={
        "loss": 0.0, "peak_memory_bytes": 1.0}), "NaN loss not named in nonfinite"),
    "nonfinite elsewhere": (lambda r: change(r, STEPS[0], "train_step", nonfinite=["loss"]),
                            f"step {STEPS[0]}: finite loss missing or nonfinite ['loss']"),
    "missing train_step": (lambda r: drop(r, STEPS[3], "train_step"),
                           f"step {STEPS[3]}: no train_step op"),
    "step outside the run": (lambda r: [*r, gc.OpRow(STEPS[-1] + 1, "forward", 1.0, {}, [])],
                             f"unexpected step {STEPS[-1] + 1} stored"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_each_broken_row_set_fails_with_its_reason(case: str) -> None:
    breaks, reason = BROKEN[case]
    problems = gc.check_rows(breaks(good_rows()), STEPS, NAN_STEP)
    assert len(problems) == 1 and reason in problems[0], problems


def reference_ms(rows: Rows, scale: float = 1.0) -> dict[str, list[float]]:
    return {phase: [r.duration_s * 1e3 * scale for r in rows if r.name == phase]
            for phase in gc.PHASES}


def test_timings_that_agree_with_cuda_events_pass_and_are_reported() -> None:
    rows = good_rows()
    problems, figures = gc.compare_timings(rows, reference_ms(rows, 1.05), STEPS)
    assert problems == []
    assert [f.split(":")[0] for f in figures] == list(gc.PHASES)
    assert "0/4 steps outside" in figures[0]


def test_timings_that_disagree_fail_but_a_rare_outlier_is_tolerated() -> None:
    steps = range(gc.START_STEP, gc.START_STEP + 100)
    rows = good_rows(steps, steps[0])
    reference = reference_ms(rows)
    reference["backward"][5] = 50.0  # one GC pause in 100 steps
    assert gc.compare_timings(rows, reference, steps)[0] == []
    reference["backward"][6:9] = [50.0, 50.0, 50.0]
    problems, _ = gc.compare_timings(rows, reference, steps)
    assert len(problems) == 1 and problems[0].startswith("backward: 4 of 100 durations")


def test_timings_with_missing_reference_or_rows_fail() -> None:
    rows = good_rows()
    short = {phase: values[:2] for phase, values in reference_ms(rows).items()}
    problems, _ = gc.compare_timings(rows, short, STEPS)
    assert problems == [f"{p}: 2 reference timings for 4 steps" for p in gc.PHASES]
    problems, _ = gc.compare_timings([], reference_ms(rows), STEPS)
    assert problems == [f"{p}: no durations to compare" for p in gc.PHASES]


def test_extra_host_syncs_and_tracker_errors_fail() -> None:
    assert gc.check_syncs(2, 2, []) == []
    problems = gc.check_syncs(0, 300, ["torch.py:215"])
    assert len(problems) == 1 and "forced 300 host sync(s)" in problems[0]
    assert "torch.py:215" in problems[0]
    assert gc.check_tracker({}, 0) == []
    assert gc.check_tracker({"RuntimeError": 3}, 2) == [
        "tracker counted 3 RuntimeError error(s)", "tracker dropped 2 pending step(s)"]


def test_workload_on_cpu_through_a_real_agent_fails_only_for_peak_memory(
    agent: AgentProcess,
) -> None:
    """The script's loop, tracker run and Parquet read, on CPU: only CUDA's peak memory lacks."""
    workload = gc.make_workload(torch, hidden=16, device="cpu")
    emitter = Emitter(socket=str(agent.socket_path), run_id=gc.RUN_ID)
    steps = range(gc.START_STEP, gc.START_STEP + 20)
    tracker = gc.tracked_run(workload, emitter, steps, nan_index=7)
    assert emitter.flush(30)
    rows = gc.stored_rows(agent, 4 * len(steps))
    assert gc.check_tracker(tracker.errors, tracker.dropped_steps) == []
    assert gc.check_rows(rows, steps, steps[7]) == [
        f"step {s}: peak_memory_bytes missing or not > 0" for s in steps]
    nan_row = next(r for r in rows if (r.step, r.name) == (steps[7], "train_step"))
    assert nan_row.nonfinite == ["loss"] and nan_row.metrics["grad_norm"] > 0
    emitter.close(1)
