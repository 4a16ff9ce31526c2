"""PyTorch training-loop instrumentation in a few lines.

    tracker = TrainingTracker(model, optimizer, run_id="r1", start_step=resumed_step)
    for batch in tracker.wrap(loader):
        loss = loss_fn(model(batch.x), batch.y)
        loss.backward()
        optimizer.step(); optimizer.zero_grad()
        tracker.metric(loss=loss)
    tracker.close()

Per step it emits `op` events `forward`, `backward` and `optimizer_step` (durations summed
over the step's calls) and one `train_step` event with the step's wall time, data-loader
wait, the metrics and, on CUDA, peak memory. The first step starts at its first loader
wait, op or metric; a step ends at the first forward or loader `next()` after an
optimizer step, or at `tracker.step()` (`step(error=exc)`: an exception the loop caught
and went on from ends it FAILED). On CUDA, durations are timed
with CUDA events and metric tensors copied without blocking; a step is emitted once its
last event has completed (polled with `query()` at later step boundaries), so the hot path
never synchronizes. A step that raises (the tracker's `with` block, or `close(error=exc)`)
is emitted FAILED with the exception, and so is the op in flight when it raised. When a
span is current as the step's first op starts (OpenTelemetry's, or emitters.tracecontext's)
the step's events carry its trace id and the span as their parent. Nothing here raises into
the training loop: failures are counted in `tracker.errors`. torch is imported when a
tracker is made.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import emitters
from emitters import tracecontext
from emitters.emitter import Emitter
from emitters.events import environment_rank
from emitters.integrations.torch_steps import PHASES, Mark, StepBuild, step_event_count
from emitters.integrations.torch_steps import Step as _Step
from emitters.integrations.torch_trace import trace_handler as trace_handler
from emitters.ops import error_fields
from emitters.values import text

log = logging.getLogger("evagg.torch")
T = TypeVar("T")


class TrainingTracker:
    """Hooks a model and optimizer; emits one set of op events per training step."""

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        *,
        run_id: str | None = None,
        job_id: str | None = None,
        start_step: int = 0,
        name: str = "train_step",
        max_pending_steps: int = 256,
        emitter: Emitter | None = None,
    ) -> None:
        try:
            import torch
        except ImportError as exc:  # the base install has no torch: say which install adds it
            raise ImportError("emitters.torch.TrainingTracker needs PyTorch in this "
                              "environment: pip install torch (or evagg[torch] with "
                              "-c constraints.txt for the CPU build)") from exc

        self._torch: Any = torch
        # A step's events are built in the emitter's sender thread, finished (none of
        # emit()'s per-field checks: the values are ours): the training thread pays only
        # for queueing the step.
        self._send = (emitter or emitters.get_emitter()).enqueue_deferred
        self.name = text(name)
        self.errors: Counter[str] = Counter()
        self.dropped_steps = 0
        self._ids = {k: text(v) for k, v in (("run_id", run_id), ("job_id", job_id)) if v}
        # Every rank of a distributed job runs its own tracker under the same run and step
        # numbers: each step's events say which rank sent them.
        self._attrs = _rank_attrs(torch)
        self._device = _cuda_device(model)  # the model's GPU: maybe not the current one
        self._cuda = self._device is not None
        self._pending: deque[_Step] = deque()
        self._max_pending = max_pending_steps
        self._step = _Step(int(start_step), self._mark())
        # The first step starts at its first loader wait, op or metric, not here: a model
        # or checkpoint loaded after the tracker is made is no step's time.
        self._fresh = True
        self._open: dict[str, Mark] = {}
        self._optimizer_done = False
        self._handles: list[Any] = []
        # Bound once: a hook per forward makes no method object per call.
        self._on_backward = self._backward_start
        self._on_backward_end = self._backward_end
        self._on_backward_done = self._backward_done
        self._engine: Any = torch.autograd.Variable._execution_engine
        self._guard(self._install, model, optimizer)

    @property
    def current_step(self) -> int:
        return self._step.step

    def _install(self, model: Any, optimizer: Any) -> None:
        if model is not None:
            self._handles.append(model.register_forward_pre_hook(self._forward_pre))
            self._handles.append(model.register_forward_hook(self._forward_post))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._optimizer_pre))
            self._handles.append(optimizer.register_step_post_hook(self._optimizer_post))
        if self._cuda:
            self._torch.cuda.reset_peak_memory_stats(self._device)

    # ---- public API -------------------------------------------------------------

    def wrap(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate `loader`, timing each wait for the next batch as data-loader wait."""
        iterator = iter(loader)
        while True:
            self._guard(self._boundary)
            started = time.perf_counter_ns()
            try:
                item = next(iterator)
            except StopIteration:
                return
            waited = (time.perf_counter_ns() - started) / 1e9
            self._step.data_wait_s = (self._step.data_wait_s or 0.0) + waited
            yield item

    def metric(self, **values: Any) -> None:
        """Record scalar metrics (tensors or numbers) for the current step, without a GPU sync."""
        for name, value in values.items():
            self._guard(self._metric, name, value)

    def step(self, error: BaseException | None = None) -> None:
        """End the current step now (loops without an optimizer, or to be explicit).

        `error`: an exception the loop caught and went on from; the step, and the op in
        flight when it was raised, read FAILED with it. Without it, a step that stopped
        before its optimizer step would run on into the next one (as gradient
        accumulation does on purpose), and every later step's number would be one less."""
        if error is not None:
            self._guard(self._fail_step, error)
        self._guard(self._close_step)

    def close(self, timeout_s: float = 10.0, error: BaseException | None = None) -> None:
        """End the last step, wait (bounded) for its CUDA work, emit all, remove the hooks.

        `error`: the exception that stopped the loop (the `with` block passes it), so the
        last step and the op in flight read FAILED with its type and message."""
        if error is not None:
            self._guard(self._fail_step, error)
        self._guard(self._close_step)
        self._guard(self._drain, time.monotonic() + timeout_s)
        if self._pending:  # their GPU work outlived the deadline: counted, not emitted
            self.dropped_steps += len(self._pending)
            self._pending.clear()
        for handle in self._handles:
            self._guard(handle.remove)
        self._handles.clear()

    def __enter__(self) -> TrainingTracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        self.close(error=exc)

    # ---- hooks (each guarded: never raise into the loop) ----------------------------

    # The hooks run on every forward, backward and optimizer step: each guards its own
    # body (a try costs nothing until it catches) rather than call through _guard.

    def _forward_pre(self, module: Any, args: Any) -> None:
        if self._optimizer_done:
            self._guard(self._close_step)
        try:
            self._begin("forward")
        except Exception as exc:
            self._count(exc)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        try:
            self._after_forward(output)
        except Exception as exc:
            self._count(exc)

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._begin("optimizer_step")
        except Exception as exc:
            self._count(exc)

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._finish("optimizer_step")
        except Exception as exc:
            self._count(exc)
        self._optimizer_done = True

    def _after_forward(self, output: Any) -> None:
        self._finish("forward")
        tensor = _first_grad_tensor(output)
        if tensor is None:
            return
        # Backward starts when the gradient reaches the output: a pre-hook on the node
        # that made it (half the cost of a tensor hook, which torch runs at the same
        # moment); a leaf output has no node, and takes the tensor hook.
        node = tensor.grad_fn
        if node is not None:
            node.register_prehook(self._on_backward)
        else:
            tensor.register_hook(self._on_backward)

    def _backward_start(self, grad: Any) -> None:  # grad: the output's (or the node's)
        if "backward" not in self._open:
            try:
                self._begin("backward")
                self._engine.queue_callback(self._on_backward_end)
            except Exception as exc:
                self._count(exc)

    def _backward_end(self) -> None:
        # The graph has run; what it queued meanwhile runs after this callback: DDP's
        # reducer waits there for the gradients' all-reduce, which is backward's time (and
        # its failure, a rank gone, is backward's). So backward ends in a callback queued
        # now, after those.
        try:
            self._engine.queue_callback(self._on_backward_done)
        except Exception as exc:
            self._count(exc)
            self._backward_done()

    def _backward_done(self) -> None:
        try:
            self._finish("backward")
        except Exception as exc:
            self._count(exc)

    # ---- bookkeeping ------------------------------------------------------------

    def _guard(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._count(exc)

    def _count(self, exc: Exception) -> None:
        reason = type(exc).__name__
        if not self.errors[reason]:
            log.warning("evagg torch instrumentation error: %r (counted)", exc)
        self.errors[reason] += 1

    def _mark(self) -> Mark:
        if not self._cuda:
            return (time.time_ns(), None)
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self._device))
        return (time.time_ns(), event)

    def _begin(self, phase: str) -> None:
        if self._fresh:
            self._start_first_step()
        if self._step.trace is False:  # once a step, in the loop's own context
            self._step.trace = tracecontext.current()
        self._open[phase] = self._mark()

    def _fail_step(self, error: BaseException) -> None:
        """The step raised: it and the phases open now (in flight) end FAILED."""
        current = self._step
        current.error = error_fields(type(error), error, error.__traceback__)
        current.failed = tuple(phase for phase in PHASES if phase in self._open)
        for phase in current.failed:
            self._finish(phase)

    def _finish(self, phase: str) -> None:
        start = self._open.pop(phase, None)
        if start is not None:
            self._step.phases.setdefault(phase, []).append((start, self._mark()))

    def _boundary(self) -> None:
        if self._fresh:
            self._start_first_step()
        if self._optimizer_done:
            self._close_step()

    def _start_first_step(self) -> None:
        self._fresh = False
        self._step.start = self._mark()

    def _metric(self, name: str, value: Any) -> None:
        if self._fresh:
            self._start_first_step()
        if isinstance(value, (int, float)):
            self._step.metrics[name] = float(value)
        elif value.device.type == "cpu" or value.device != self._device:
            # The step-end event is recorded on the model's GPU only: a metric anywhere else
            # (a CPU model, a loss on another GPU) has no event to wait on before its
            # non-blocking copy may be read, so it is read at once (a sync, but right).
            self._step.metrics[name] = float(value.detach().item())
        else:  # copied into pinned host memory; read once the step's end event is done
            self._step.deferred[name] = value.detach().to("cpu", non_blocking=True)

    def _close_step(self) -> None:
        self._optimizer_done = False
        current = self._step
        if not current.active():
            return
        current.end = self._mark()
        if self._cuda:
            current.peak_memory_bytes = int(self._torch.cuda.max_memory_allocated(self._device))
            self._torch.cuda.reset_peak_memory_stats(self._device)
        self._pending.append(current)
        if len(self._pending) > self._max_pending:
            self._pending.popleft()
            self.dropped_steps += 1
        self._step = _Step(current.step + 1, current.end)
        self._drain()

    def _drain(self, deadline: float | None = None) -> None:
        while self._pending:
            end = self._pending[0].end
            if end is not None and end[1] is not None and not end[1].query():
                if deadline is None or time.monotonic() >= deadline:
                    return
                time.sleep(0.001)
                continue
            self._guard(self._emit, self._pending.popleft())

    def _emit(self, done: _Step) -> None:
        self._send(step_event_count(done), StepBuild(done, self.name, self._ids, self._attrs))


def _rank_attrs(torch: Any) -> dict[str, str]:
    """`rank` and `world_size` of a distributed job: torch.distributed's once its process
    group is made, else those torchrun (and most launchers) put in the environment, so a
    tracker made before init_process_group() knows its rank too; none for one process."""
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return {"rank": str(dist.get_rank()), "world_size": str(dist.get_world_size())}
    except Exception:
        pass
    return environment_rank()


def _cuda_device(model: Any) -> Any:
    """The CUDA device of the model's first parameter, or None (CPU, or no model)."""
    if model is None:
        return None
    for parameter in model.parameters():
        return parameter.device if parameter.device.type == "cuda" else None
    return None


def _first_grad_tensor(output: Any) -> Any:
    if hasattr(output, "requires_grad"):
        return output if output.requires_grad else None
    items = output.values() if isinstance(output, dict) else output
    if isinstance(items, (list, tuple)) or isinstance(output, dict):
        for item in items:
            if getattr(item, "requires_grad", False):
                return item
    return None
