"""The CUDA path of emitters.torch, end to end, on a real GPU and a real agent.

    python bench/gpu_check.py [--steps 300] [--nan-step 137] [--rounds 4] [--hidden 4096]

No CUDA device: prints "no CUDA device: nothing checked", exits 0. Otherwise: trains an MLP
(1024-H-H-1024, batch 256, Adam, clipping) on the GPU under TrainingTracker into an agent
(tests/agentproc.py) in a temporary directory, the reported loss made NaN at one step, and
checks the Parquet and the run (see check_* and docs/pytorch.md). Prints the figures;
exits 1 with the list of failures if any check fails.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NO_DEVICE = "no CUDA device: nothing checked"
PHASES = ("forward", "backward", "optimizer_step")
RUN_ID = "gpu-check"
START_STEP = 1000
ABS_TOL_MS = 0.2  # tracker and script events differ by a few host calls, not by work
REL_TOL = 0.1
MAX_OFF_FRACTION = 0.02  # outliers allowed (GC pauses, first-step setup)
SYNC_WARNING = "synchronizing CUDA operation"


@dataclass(frozen=True)
class OpRow:
    step: int
    name: str
    duration_s: float | None
    metrics: dict[str, float]
    nonfinite: list[str]


def as_rows(raw: Iterable[Sequence[Any]]) -> list[OpRow]:
    """(step, name, duration_s, metrics, nonfinite) tuples from DuckDB into OpRows."""
    return [OpRow(int(step), str(name), duration, dict(metrics or {}), list(nonfinite or []))
            for step, name, duration, metrics, nonfinite in raw]


def check_rows(rows: Sequence[OpRow], steps: range, nan_step: int) -> list[str]:
    """Problems with the stored ops: missing, non-positive, no peak memory, wrong nonfinite."""
    by_key = {(r.step, r.name): r for r in rows}
    problems = [f"unexpected step {s} stored" for s in sorted({r.step for r in rows} - set(steps))]
    for step in steps:
        for phase in PHASES:
            row = by_key.get((step, phase))
            if row is None:
                problems.append(f"step {step}: no {phase} op")
            elif not _positive(row.duration_s):
                problems.append(f"step {step}: {phase} duration_s {row.duration_s} (want > 0)")
        done = by_key.get((step, "train_step"))
        if done is None:
            problems.append(f"step {step}: no train_step op")
            continue
        if not _positive(done.metrics.get("peak_memory_bytes")):
            problems.append(f"step {step}: peak_memory_bytes missing or not > 0")
        if step == nan_step and ("loss" not in done.nonfinite or "loss" in done.metrics):
            problems.append(f"step {step}: NaN loss not named in nonfinite ({done.nonfinite})")
        if step != nan_step and (done.nonfinite or "loss" not in done.metrics):
            problems.append(f"step {step}: finite loss missing or nonfinite {done.nonfinite}")
    return problems


def compare_timings(rows: Sequence[OpRow], reference_ms: Mapping[str, Sequence[float]],
                    steps: range) -> tuple[list[str], list[str]]:
    """(problems, figures): tracker durations against the script's own CUDA-event timings."""
    by_key = {(r.step, r.name): r for r in rows}
    problems: list[str] = []
    figures: list[str] = []
    for phase in PHASES:
        reference = reference_ms.get(phase, [])
        if len(reference) != len(steps):
            problems.append(f"{phase}: {len(reference)} reference timings for {len(steps)} steps")
        pairs = [(row.duration_s * 1e3, ref) for step, ref in zip(steps, reference, strict=False)
                 if (row := by_key.get((step, phase))) is not None and row.duration_s is not None]
        if not pairs:
            problems.append(f"{phase}: no durations to compare")
            continue
        off = [(t, r) for t, r in pairs if abs(t - r) > max(ABS_TOL_MS, REL_TOL * r)]
        figures.append(
            f"{phase}: tracker median {statistics.median(t for t, _ in pairs):.3f} ms, "
            f"script's CUDA events {statistics.median(r for _, r in pairs):.3f} ms, median "
            f"|diff| {statistics.median(abs(t - r) for t, r in pairs):.3f} ms, "
            f"{len(off)}/{len(pairs)} steps outside {ABS_TOL_MS} ms or {REL_TOL:.0%}")
        if len(off) > MAX_OFF_FRACTION * len(pairs):
            problems.append(f"{phase}: {len(off)} of {len(pairs)} durations disagree with CUDA "
                            f"events, e.g. tracker {off[0][0]:.3f} ms vs {off[0][1]:.3f} ms")
    return problems, figures


def check_syncs(plain: int, tracked: int, where: Sequence[str]) -> list[str]:
    """The tracked loop may not synchronize more often than the same loop without it."""
    if tracked > plain:
        return [f"tracker forced {tracked - plain} host sync(s) (plain loop {plain}, tracked "
                f"{tracked}); synchronizing calls at: {', '.join(where) or 'unknown'}"]
    return []


def check_tracker(errors: Mapping[str, int], dropped_steps: int) -> list[str]:
    dropped = [f"tracker dropped {dropped_steps} pending step(s)"] if dropped_steps else []
    return [f"tracker counted {n} {reason} error(s)" for reason, n in errors.items() if n] + dropped


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


# ---- the run: torch, the agent and the tracker are imported only when needed -----------


@dataclass
class Workload:
    torch: Any
    model: Any  # forwards to the MLP; records this script's CUDA events when marks is a list
    optimizer: Any
    batches: list[tuple[Any, Any]]
    zero: Any
    nan: Any


def make_workload(torch: Any, hidden: int, device: str = "cuda") -> Workload:
    class Marked(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.marks: dict[str, list[tuple[Any, Any]]] | None = None

        def forward(self, x: Any) -> Any:
            out = timed(torch, self.marks, "forward", lambda: self.inner(x))
            if self.marks is not None:  # backward is timed from the gradient reaching `out`
                out.register_hook(self.grad_arrived)
            return out

        def grad_arrived(self, grad: Any) -> None:
            self.backward_start = cuda_event(torch)

    torch.manual_seed(0)
    nn = torch.nn
    mlp = nn.Sequential(nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                        nn.ReLU(), nn.Linear(hidden, 1024)).to(device)
    batches = [(torch.randn(256, 1024, device=device),
                torch.randint(0, 1024, (256,), device=device)) for _ in range(16)]
    return Workload(torch, Marked(mlp), torch.optim.Adam(mlp.parameters(), lr=1e-4), batches,
                    torch.zeros((), device=device), torch.full((), math.nan, device=device))


def timed(torch: Any, marks: dict[str, list[tuple[Any, Any]]] | None, phase: str,
          work: Callable[[], Any]) -> Any:
    """Run `work`; with `marks`, between two CUDA events of this script's own."""
    if marks is None:
        return work()
    start = cuda_event(torch)
    out = work()
    marks[phase].append((start, cuda_event(torch)))
    return out


def cuda_event(torch: Any) -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def train(w: Workload, steps: int, tracker: Any = None, nan_index: int = -1,
          marks: dict[str, list[tuple[Any, Any]]] | None = None) -> None:
    """The usual loop, with no host sync of its own."""
    torch = w.torch
    w.model.marks = marks
    data = [w.batches[i % len(w.batches)] for i in range(steps)]
    for i, (x, y) in enumerate(tracker.wrap(data) if tracker is not None else data):
        loss = torch.nn.functional.cross_entropy(w.model(x), y)
        loss.backward()
        if marks is not None:
            marks["backward"].append((w.model.backward_start, cuda_event(torch)))
        grad_norm = torch.nn.utils.clip_grad_norm_(w.model.parameters(), 1.0)
        timed(torch, marks, "optimizer_step", w.optimizer.step)
        w.optimizer.zero_grad(set_to_none=True)
        shown = loss.detach() + (w.nan if i == nan_index else w.zero)
        if tracker is not None:
            tracker.metric(loss=shown, grad_norm=grad_norm)
    w.model.marks = None


def count_syncs(torch: Any, work: Callable[[], None]) -> tuple[int, list[str]]:
    """Synchronizing CUDA calls made by `work`, and where (file:line) they were made."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if SYNC_WARNING in str(w.message)]
    return len(syncs), sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})


def steps_per_s(w: Workload, steps: int, emitter: Any, errors: Counter[str]) -> float:
    w.torch.cuda.synchronize()
    started = time.perf_counter()
    if emitter is None:
        train(w, steps)
    else:
        errors.update(tracked_run(w, emitter, range(steps), -1, f"{RUN_ID}-overhead").errors)
    w.torch.cuda.synchronize()
    return steps / (time.perf_counter() - started)


def overhead(w: Workload, steps: int, rounds: int, emitter: Any,
             errors: Counter[str]) -> tuple[float, float, float]:
    """(plain steps/s, tracked steps/s, median % slower over round pairs), order alternating."""
    plain: list[float] = []
    tracked: list[float] = []
    for r in range(rounds):
        order = [(plain, None), (tracked, emitter)]
        for samples, peer in order if r % 2 == 0 else order[::-1]:
            samples.append(steps_per_s(w, steps, peer, errors))
    slower = statistics.median((a - b) / a * 100 for a, b in zip(plain, tracked, strict=True))
    return statistics.median(plain), statistics.median(tracked), slower


def tracked_run(w: Workload, emitter: Any, steps: range, nan_index: int, run_id: str = RUN_ID,
                marks: dict[str, list[tuple[Any, Any]]] | None = None) -> Any:
    """Train `len(steps)` steps under a TrainingTracker numbered from steps.start; closed."""
    from emitters.torch import TrainingTracker

    tracker = TrainingTracker(w.model, w.optimizer, run_id=run_id, start_step=steps.start,
                              emitter=emitter)
    train(w, len(steps), tracker, nan_index, marks)
    tracker.close()
    return tracker


def stored_rows(agent: Any, count: int, timeout_s: float = 60) -> list[OpRow]:
    """This run's torch rows in the lake, once `count` are there or time is up."""
    sql = ("SELECT step, name, duration_s, metrics, nonfinite FROM events "
           f"WHERE source = 'torch' AND run_id = '{RUN_ID}'")
    deadline = time.monotonic() + timeout_s
    rows: list[tuple[Any, ...]] = []
    while len(rows) < count and time.monotonic() < deadline:
        time.sleep(0.5)
        if any(agent.lake_dir.rglob("*.parquet")):
            rows = agent.query(sql)
    return as_rows(rows)


def run_on_gpu(args: argparse.Namespace) -> list[str]:
    import torch

    from emitters.emitter import Emitter
    from tests.agentproc import AgentProcess

    steps = range(START_STEP, START_STEP + args.steps)
    problems: list[str] = []
    if not torch.ones((), device="cuda").to("cpu", non_blocking=True).is_pinned():
        problems.append("a non_blocking copy to the host is not pinned: metric copies would sync")
    w = make_workload(torch, args.hidden)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, MLP hidden "
          f"{args.hidden}, {args.steps} steps, NaN loss at step {steps[args.nan_step]}")
    train(w, 20)  # cuBLAS, allocator and Adam state warm-up
    plain_syncs, _ = count_syncs(torch, lambda: train(w, args.steps))
    marks: dict[str, list[tuple[Any, Any]]] = {phase: [] for phase in PHASES}
    trackers: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="evagg-gpu-check-") as workdir, \
            AgentProcess(Path(workdir)) as agent:
        emitter = Emitter(socket=str(agent.socket_path), run_id=RUN_ID)
        tracked_syncs, where = count_syncs(torch, lambda: trackers.append(
            tracked_run(w, emitter, steps, args.nan_step, marks=marks)))
        torch.cuda.synchronize()
        errors = Counter(trackers[0].errors)
        rates = overhead(w, args.steps, args.rounds, emitter, errors)
        if not emitter.flush(60):
            problems.append(f"emitter did not deliver everything in 60 s: {emitter.stats()}")
        rows = stored_rows(agent, 4 * args.steps)
        emitter.close(5)
    reference = {p: [a.elapsed_time(b) for a, b in pairs] for p, pairs in marks.items()}
    timing_problems, figures = compare_timings(rows, reference, steps)
    peaks = [r.metrics.get("peak_memory_bytes", 0.0) / 2**20 for r in rows
             if r.name == "train_step"]
    print("\n".join([
        *figures, f"peak memory per step: min {min(peaks, default=0):.0f} MiB, max "
        f"{max(peaks, default=0):.0f} MiB over {len(peaks)} train_step rows",
        f"host syncs over {args.steps} steps: plain loop {plain_syncs}, tracked {tracked_syncs}",
        f"steps/s: plain {rates[0]:.1f}, tracked {rates[1]:.1f}, slower by {rates[2]:.2f}% "
        f"(median of {args.rounds} interleaved round pairs; target < 1%)",
        f"torch.cuda.max_memory_allocated(): {peak_query_us(torch):.1f} us per call (host, "
        "once per step)"]))
    return [*problems, *check_rows(rows, steps, steps[args.nan_step]), *timing_problems,
            *check_syncs(plain_syncs, tracked_syncs, where),
            *check_tracker(errors, trackers[0].dropped_steps)]


def peak_query_us(torch: Any, calls: int = 1000) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        torch.cuda.max_memory_allocated()
    return (time.perf_counter() - started) / calls * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--nan-step", type=int, default=137, help="index within the run")
    parser.add_argument("--rounds", type=int, default=4, help="overhead rounds (A/B pairs)")
    parser.add_argument("--hidden", type=int, default=4096)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_DEVICE)
        return 0
    try:
        problems = run_on_gpu(args)
    except Exception:  # the loop or the agent failing is a failed check, not a crash
        traceback.print_exc()
        problems = ["the GPU run raised (traceback above)"]
    if problems:
        more = [f"... and {len(problems) - 20} more"] if len(problems) > 20 else []
        print("\n  - ".join([f"GPU check FAILED: {len(problems)} problem(s)", *problems[:20],
                            *more]))
        return 1
    print("GPU check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
