"""`with op(name, step=...) as o:` records STARTED, then FINISHED or FAILED, around a block.

The caller pays for two clock reads and two queue appends. The task id that pairs the
events, the parent op's id and the event dicts are made later in the sender thread; only a
failure's traceback is formatted here, while the frames it names still exist.

An op entered while a span is current (an OpenTelemetry span, in a process that imported
OpenTelemetry already, or one of emitters.tracecontext's) is a span of that trace: its
events carry the trace id, the op's own id as span id, and the current span as parent.
"""

from __future__ import annotations

import contextvars
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from emitters.ids import new_span_id
from emitters.snapshot import snapshot_fields
from emitters.tracecontext import TraceContext
from emitters.tracecontext import current as current_span

STARTED = "STARTED"
FINISHED = "FINISHED"
FAILED = "FAILED"

# Longer tracebacks keep their head and tail: a deep recursion is not worth a megabyte.
STACK_TRACE_LIMIT = 32 * 1024

_time_ns = time.time_ns
_perf_ns = time.perf_counter_ns


# What an Op needs from its emitter: a bounded enqueue that never raises nor blocks.
Put = Callable[[tuple[Any, ...]], None]


class Op:
    """One operation. Queued items are `(time_ns, op, state, duration_ns, outcome)`."""

    __slots__ = ("_ids", "_metrics", "_perf_start", "_put", "_token", "_updates",
                 "fields", "name", "parent", "span")

    def __init__(self, put: Put, name: str, step: int | None, fields: dict[str, Any]) -> None:
        if step is not None:
            fields["step"] = step
        self._put = put
        self.name = name
        self.fields = snapshot_fields(fields)
        self.parent: Op | None = None
        self.span: TraceContext | None = None  # the span current when the op began
        self._metrics: dict[str, Any] | None = None
        self._updates: dict[str, Any] | None = None
        # A list so that the caller and the sender thread agree on the first id appended.
        self._ids: list[str] = []
        self._perf_start = 0
        self._token: contextvars.Token[Op | None] | None = None

    @property
    def task_id(self) -> str:
        """The id on both of this op's events (and the parent_id of ops nested in it)."""
        ids = self._ids
        if not ids:
            ids.append(new_span_id())
        return ids[0]

    def metric(self, **values: Any) -> None:
        """Numbers for the terminal event; NaN and infinities are recorded by name only."""
        if self._metrics is None:
            self._metrics = snapshot_fields(values)
        else:
            self._metrics.update(snapshot_fields(values))

    def set(self, **fields: Any) -> None:
        """More fields (or attrs) for the terminal event."""
        if self._updates is None:
            self._updates = snapshot_fields(fields)
        else:
            self._updates.update(snapshot_fields(fields))

    def __enter__(self) -> Op:
        self.parent = _CURRENT.get()
        # Read here, in the caller's context: the sender thread has another one. Without
        # OpenTelemetry imported this is a contextvar read and a sys.modules lookup.
        self.span = current_span()
        self._token = _CURRENT.set(self)
        self._perf_start = _perf_ns()
        self._put((_time_ns(), self, STARTED, None, None))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        duration_ns = _perf_ns() - self._perf_start
        # Hand the dicts over to the sender thread; later metric() calls start new ones.
        metrics, self._metrics = self._metrics, None
        updates, self._updates = self._updates, None
        if exc_type is None:
            self._put((_time_ns(), self, FINISHED, duration_ns, (metrics, updates, None)))
        else:
            error = error_fields(exc_type, exc, tb)
            self._put((_time_ns(), self, FAILED, duration_ns, (metrics, updates, error)))
        self._restore_context()
        # Returning None lets the exception propagate unchanged.

    async def __aenter__(self) -> Op:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    def _restore_context(self) -> None:
        token, self._token = self._token, None
        if token is None:
            return
        try:  # noqa: SIM105 (on every op exit: a plain try costs nothing)
            _CURRENT.reset(token)
        except (ValueError, RuntimeError):
            # Exited in another context than it entered (a generator resumed elsewhere):
            # nesting there is already wrong, and the caller must not see an error.
            pass


_CURRENT: contextvars.ContextVar[Op | None] = contextvars.ContextVar("evagg_op", default=None)


def current_op() -> Op | None:
    """The innermost op open in this thread or asyncio task."""
    return _CURRENT.get()


def error_fields(exc_type: type[BaseException], exc: BaseException | None,
                 tb: TracebackType | None) -> dict[str, str]:
    """error_type (class name), error_message and the formatted traceback; never raises."""
    try:
        message = str(exc) if exc is not None else ""
    except Exception:
        message = f"<unprintable {exc_type.__name__}>"
    try:
        stack = "".join(traceback.format_exception(exc_type, exc, tb))
    except Exception:
        stack = ""
    if len(stack) > STACK_TRACE_LIMIT:
        half = STACK_TRACE_LIMIT // 2
        stack = f"{stack[:half]}\n... [{len(stack) - 2 * half} characters cut] ...\n{stack[-half:]}"
    return {"error_type": exc_type.__name__, "error_message": message, "stack_trace": stack}
