"""Training steps/s with and without TrainingTracker, small CPU model, interleaved runs.

    python bench/bench_torch_overhead.py [--rounds 10] [--steps 200] [--threads 1]
    python bench/bench_torch_overhead.py --compare REV [--rounds 10] [--steps 300]

The model is an MLP 256-1024-1024-10 (1.3M parameters), batch 64, Adam, batches made in
advance. Each round runs the plain loop and the instrumented one (tracker.wrap, forward,
backward and optimizer hooks, tracker.metric(loss=...) every step, four events a step),
in alternating order so drift hits both alike. On a shared machine that A/B is noisier
than the overhead it looks for, so the same A/B also runs on a tiny model (Linear 8-1,
batch 8), where a step costs little more than the instrumentation: the difference there
is the tracker's cost per step, set against the MLP's step time. The emitter really
sends: an acking peer that speaks emitters.wire runs in a subprocess. Intra-op threads
default to 1 because the box is shared; pass --threads 0 for torch's default. Printed:
steps/s by the wall clock, and this process's CPU per step (all threads, the emitter's
sender included), which other load on a shared machine disturbs less than wall time.

--compare REV: the tracker of git revision REV (emitters/integrations/torch.py and torch_steps.py as
committed there, loaded beside the working tree's) and this one, side by side in one
process on the tiny model: plain, REV's tracker and this tracker in rotating order each
round, so that the load of the moment hits all three alike. Printed: each tracker's CPU
per step over plain (median of rounds, and the spread), and the ratio of the two.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))



def make(torch: Any, tiny: bool) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    torch.manual_seed(0)
    if tiny:
        model = torch.nn.Linear(8, 10)
        data = [(torch.randn(8, 8), torch.randint(0, 10, (8,))) for _ in range(32)]
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        data = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(32)]
    return model, torch.optim.Adam(model.parameters(), lr=1e-4), data


def loop(torch: Any, model: Any, optimizer: Any, batches: Iterable[Any], tracker: Any) -> None:
    loss_fn = torch.nn.functional.cross_entropy
    for x, y in batches:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if tracker is not None:
            tracker.metric(loss=loss)


def one_run(torch: Any, steps: int, emitter: Any | None, tiny: bool,
            tracker_class: Any = None) -> tuple[float, float, float]:
    """(steps/s by the wall clock, CPU ms per step, the training thread's CPU ms per
    step)."""
    from emitters.torch import TrainingTracker

    model, optimizer, data = make(torch, tiny)
    batches = [data[i % len(data)] for i in range(steps)]
    tracker = (tracker_class or TrainingTracker)(model, optimizer, run_id="bench",
                                                 emitter=emitter) \
        if emitter is not None else None
    started, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    loop(torch, model, optimizer, tracker.wrap(batches) if tracker else batches, tracker)
    if tracker is not None and emitter is not None:
        tracker.close()
        own = time.thread_time() - own  # before the wait: the loop's own thread's work
        emitter.flush(30)  # the sender's CPU counts; the wait for acks barely does
        assert not tracker.errors, tracker.errors
    else:
        own = time.thread_time() - own
    elapsed = time.perf_counter() - started
    return steps / elapsed, (time.process_time() - cpu) / steps * 1e3, own / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compare", metavar="REV",
                        help="the tracker at git revision REV against this one, side by side")
    args = parser.parse_args()

    import torch
    from ackpeer import start_ack_peer

    from emitters import Emitter

    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(tempfile.mkdtemp(prefix="evagg-bench-")) / "events.sock"
    peer = start_ack_peer(path)
    try:
        emitter = Emitter(socket=str(path))
        if args.compare:
            compare(torch, emitter, args.compare, args.rounds, args.steps * 10)
            emitter.close(5)
            return
        print(f"{args.rounds} interleaved rounds, {torch.get_num_threads()} intra-op thread(s); "
              "medians of rounds")
        tiny = ab(torch, emitter, args.rounds, args.steps * 10, tiny=True)
        mlp = ab(torch, emitter, args.rounds, args.steps, tiny=False)
        report("tiny model", args.steps * 10, *tiny)
        report("MLP 1.3M", args.steps, *mlp)
        cost_ms = statistics.median(b[1] - a[1] for a, b in zip(*tiny, strict=True))
        own_ms = statistics.median(b[2] - a[2] for a, b in zip(*tiny, strict=True))
        step_ms = statistics.median(a[1] for a in mlp[0])
        print(f"tracker CPU per step (tiny-model difference): {cost_ms * 1e3:.1f} us = "
              f"{cost_ms / step_ms * 100:.2f}% of an MLP step ({step_ms:.2f} ms CPU); "
              "target < 1%")
        print(f"of which in the training loop's thread: {own_ms * 1e3:.1f} us per step "
              "(the rest is the emitter's sender thread)")
        print(f"emitter: {emitter.stats()}")
        emitter.close(5)
    finally:
        peer.kill()


def ab(torch: Any, emitter: Any, rounds: int, steps: int,
       tiny: bool) -> tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]:
    one_run(torch, 50, None, tiny)  # warm up both paths
    one_run(torch, 50, emitter, tiny)
    plain: list[tuple[float, float, float]] = []
    tracked: list[tuple[float, float, float]] = []
    for r in range(rounds):
        order = [(plain, None), (tracked, emitter)]
        for samples, peer_emitter in order if r % 2 == 0 else order[::-1]:
            samples.append(one_run(torch, steps, peer_emitter, tiny))
    return plain, tracked


def tracker_at(rev: str) -> Any:
    """TrainingTracker as committed at `rev`, its torch_steps beside it (not the tree's)."""
    def source(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout

    def module_source(name: str) -> str:  # in emitters/integrations/ since it has a room
        try:
            return source(f"emitters/integrations/{name}.py")
        except subprocess.CalledProcessError:
            return source(f"emitters/{name}.py")

    steps_name, torch_name = "_bench_old_torch_steps", "_bench_old_torch"
    tracker_text = module_source("torch").replace(
        "emitters.integrations.torch_steps", steps_name).replace("emitters.torch_steps", steps_name)
    for name, text in ((steps_name, module_source("torch_steps")), (torch_name, tracker_text)):
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while being made
        exec(compile(text, f"{rev}:{name}", "exec"), module.__dict__)
    return sys.modules[torch_name].TrainingTracker


def compare(torch: Any, emitter: Any, rev: str, rounds: int, steps: int) -> None:
    from emitters.torch import TrainingTracker

    old = tracker_at(rev)
    runs = {"plain": None, rev: old, "this tree": TrainingTracker}
    for tracker_class in runs.values():  # warm up all three
        one_run(torch, 50, emitter if tracker_class else None, True, tracker_class)
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    own: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            tracker_class = runs[name]
            _, all_threads, training = one_run(torch, steps, emitter if tracker_class else None,
                                               True, tracker_class)
            cpu[name].append(all_threads * 1e3)
            own[name].append(training * 1e3)
    print(f"tiny model x {steps} steps, {rounds} rounds in rotating order, "
          f"{torch.get_num_threads()} intra-op thread(s); CPU us per step")
    for label, figures in (("all threads (the sender's too)", cpu),
                           ("the training loop's thread", own)):
        plain = figures["plain"]
        print(f"{label}: plain median {statistics.median(plain):.1f} "
              f"(range {min(plain):.1f}-{max(plain):.1f})")
        costs = {}
        for name in names[1:]:
            over = [t - p for t, p in zip(figures[name], plain, strict=True)]
            costs[name] = statistics.median(over)
            print(f"  tracker {name}: +{costs[name]:.1f} us per step over plain, median of "
                  f"rounds (range {min(over):.1f} to {max(over):.1f})")
        print(f"  this tree / {rev}: {costs['this tree'] / costs[rev]:.2f}")


def report(name: str, steps: int, plain: list[tuple[float, float, float]],
           tracked: list[tuple[float, float, float]]) -> None:
    pairs = list(zip(plain, tracked, strict=True))
    wall = statistics.median((a[0] - b[0]) / a[0] * 100 for a, b in pairs)
    cpu = statistics.median((b[1] - a[1]) / a[1] * 100 for a, b in pairs)
    print(f"{name} x {steps} steps: plain {statistics.median(r[0] for r in plain):.1f} "
          f"steps/s, {statistics.median(r[1] for r in plain):.3f} ms CPU/step; tracked "
          f"{statistics.median(r[0] for r in tracked):.1f} steps/s, "
          f"{statistics.median(r[1] for r in tracked):.3f} ms CPU/step; slower by "
          f"{wall:.2f}% wall, {cpu:.2f}% CPU (median of round pairs)")


if __name__ == "__main__":
    main()
