"""Ops inside Ray tasks and actors, stamped with Ray's ids and linked by W3C trace context.

    @ray.remote
    @traced_remote                      # op STARTED/FINISHED/FAILED around every call
    def train_shard(shard): ...

    with ray_op("epoch", step=3):       # in the driver: the root span of a trace
        ray.get(train_shard.remote(s, **trace_kwargs()))

Each op event carries Ray's task_id, attempt, job_id, node_id, worker_id and actor_id
(hex, as `ray.get_runtime_context()` gives them), so it joins the `tasks` view, and
trace_id, span_id and parent_span_id: the STARTED and the terminal event of one op share
its span_id. `traced_remote` adds a keyword-only parameter `evagg_trace` to the function's
signature; `trace_kwargs()` fills it on the caller's side, so one trace runs from a
driver step through every nested remote call. Ray is never imported here: a process
that has not imported it is not a Ray worker, and its ops carry no Ray ids.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, cast

from emitters.ops import error_fields
from emitters.tracecontext import (
    Attached,
    TraceContext,
    activate,
    attach_trace_context,
    current,
    new_child,
)
from emitters.tracecontext import inject_trace_context as _inject

log = logging.getLogger("evagg.ray")

TRACE_KWARG = "evagg_trace"
F = TypeVar("F", bound=Callable[..., Any])

_failures = {"emit": 0, "ray_ids": 0}


def _count_failure(reason: str, exc: BaseException) -> None:
    _failures[reason] += 1
    if _failures[reason] == 1:
        log.warning("evagg ray integration: %s failed (%r); counting further failures",
                    reason, exc)


def ray_ids() -> dict[str, Any]:
    """task_id, attempt, actor_id, job_id, node_id and worker_id of this Ray process (only
    those set); {} outside Ray."""
    ray = sys.modules.get("ray")
    if ray is None:
        return {}
    try:
        if not ray.is_initialized():
            return {}
        context = ray.get_runtime_context()
        # Not cached: a driver can shut Ray down and start another cluster (new node id).
        ids: dict[str, Any] = {"job_id": context.get_job_id(), "node_id": context.get_node_id(),
                               "worker_id": context.get_worker_id()}
        worker = ray._private.worker
        if worker.global_worker.mode == worker.WORKER_MODE:  # the driver has no task
            ids["task_id"] = context.get_task_id()
            ids["actor_id"] = context.get_actor_id()
            ids["attempt"] = worker.global_worker.core_worker.get_current_task_attempt_number()
        return {k: v for k, v in ids.items() if v is not None and v != ""}
    except Exception as exc:
        _count_failure("ray_ids", exc)
        return {}


def _emit(name: str, state: str, fields: dict[str, Any]) -> None:
    try:
        import emitters

        emitters.emit(kind="op", name=name, state=state, **fields)
    except Exception as exc:
        _count_failure("emit", exc)


class RayOp:
    """One op: STARTED on enter, FINISHED or FAILED (with the error) on exit."""

    __slots__ = ("_attached", "_fields", "_metrics", "_start_ns", "context", "name")

    def __init__(self, name: str, fields: dict[str, Any]) -> None:
        self.name = name
        self._fields = fields
        self._metrics: dict[str, Any] = {}
        self._attached: Attached | None = None
        self._start_ns = 0
        self.context: TraceContext | None = None  # set on enter: the parent is current then

    def metric(self, **values: Any) -> None:
        """Numbers for the terminal event."""
        self._metrics.update(values)

    def set(self, **fields: Any) -> None:
        """More fields (or attrs) for the terminal event."""
        self._fields.update(fields)

    def __enter__(self) -> RayOp:
        self.context = new_child(current())
        self._attached = activate(self.context)
        self._fields = {**ray_ids(), **self._fields, **self.context.fields()}
        self._start_ns = time.perf_counter_ns()
        _emit(self.name, "STARTED", self._fields)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        fields = {**self._fields, "duration_s": (time.perf_counter_ns() - self._start_ns) / 1e9}
        if self._metrics:
            fields["metrics"] = self._metrics
        if exc_type is None:
            _emit(self.name, "FINISHED", fields)
        else:
            _emit(self.name, "FAILED", {**fields, **error_fields(exc_type, exc, tb)})
        if self._attached is not None:
            self._attached.detach()

    async def __aenter__(self) -> RayOp:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


def ray_op(name: str, *, step: int | None = None, **fields: Any) -> RayOp:
    """An op under the current span (or a new trace), stamped with Ray's ids."""
    if step is not None:
        fields["step"] = step
    return RayOp(name, fields)


def inject_trace_context(meta: dict[str, Any]) -> dict[str, Any]:
    return _inject(meta)


def trace_kwargs() -> dict[str, dict[str, Any]]:
    """Keyword arguments for `.remote()` of a `traced_remote` function: the current span."""
    return {TRACE_KWARG: _inject({})}


def traced_remote(func: F | None = None, *, name: str | None = None,
                  **fields: Any) -> Any:
    """Decorate a function (below `@ray.remote`) or an actor method: each call is a
    `ray_op` under the caller's span passed in `evagg_trace=` (see `trace_kwargs`)."""
    def decorate(f: F) -> F:
        # Named the way Ray names tasks: "fn", "Class.method" (no "outer.<locals>.")
        op_name = name or f.__qualname__.rsplit("<locals>.", 1)[-1]
        if inspect.iscoroutinefunction(f):
            async def run_async(*args: Any, evagg_trace: Any = None, **kwargs: Any) -> Any:
                with attach_trace_context(evagg_trace), ray_op(op_name, **fields):
                    return await f(*args, **kwargs)
            wrapper: Callable[..., Any] = run_async
        else:
            def run(*args: Any, evagg_trace: Any = None, **kwargs: Any) -> Any:
                with attach_trace_context(evagg_trace), ray_op(op_name, **fields):
                    return f(*args, **kwargs)
            wrapper = run
        functools.update_wrapper(wrapper, f)
        wrapper.__module__ = _module_ray_names(f)
        # Ray checks .remote() arguments against inspect.signature(), which reads
        # __signature__; for actor methods it first unwraps __wrapped__, so drop that.
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        wrapper.__signature__ = _with_trace_parameter(inspect.signature(f))  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate(func) if func is not None else decorate


def _module_ray_names(f: Callable[..., Any]) -> str:
    """The module Ray names `f`'s task after. For a function of the script Ray runs
    (`__main__`), Ray takes the file name of the function's code, which for the wrapper
    is this file ("ray.work" for ray_job.py's work): the script's module name is given
    instead, as Ray would find it for `f`. cloudpickle still sends such a function by
    value, as no imported module of that name holds it."""
    module = getattr(f, "__module__", None) or "__main__"
    if module != "__main__":
        return module
    try:
        return inspect.getmodulename(inspect.getfile(f)) or module
    except TypeError:  # no source file (a builtin, a function made in a REPL's exec)
        return module


def _with_trace_parameter(signature: inspect.Signature) -> inspect.Signature:
    params = list(signature.parameters.values())
    extra = inspect.Parameter(TRACE_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None)
    at = len(params)
    if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD:
        at -= 1
    return signature.replace(parameters=[*params[:at], extra, *params[at:]])
