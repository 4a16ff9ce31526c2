"""evagg's producer side: hand events to the node's agent for about a microsecond each.

    import emitters
    emitters.configure(run_id="exp-42")          # or EVAGG_JOB_ID / EVAGG_RUN_ID / EVAGG_NODE_ID
    emitters.emit(kind="task", name="load", state="FINISHED", duration_s=0.8)
    with emitters.op("train_step", step=3) as op:
        op.metric(loss=0.31)
    emitters.flush(2.0)                          # or, at the end: emitters.close(2.0)
    print(emitters.stats())                      # emitted, acked, dropped by reason, ...

Only the standard library and orjson are imported here; integrations (emitters.ray,
emitters.torch, emitters.otel) import their frameworks when used.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from emitters.emitter import Emitter
from emitters.fields import AGENT_STAMPED, EVENT_FIELDS, KINDS, OP_STATES, REQUIRED, TASK_STATES
from emitters.ops import Op, current_op
from emitters.stats import EmitterStats

# The default emitter is made on first use (the functions below, get_emitter()), not at
# import: the agent, the sinks and the dashboard import emitters.wire and friends, which
# imports this package, and must not set up a producer (read EVAGG_*, make a queue).
# The exit and fork hooks stay registered at import (emitters/emitter.py): they do
# nothing without an emitter, and a producer's own atexit hooks registered after
# `import emitters` still run before the emitter closes, as they always did.
_default: Emitter | None = None
_default_lock = threading.Lock()
_DEFAULT_FUNCTIONS = frozenset({"emit", "op", "configure", "flush", "close"})


def get_emitter() -> Emitter:
    """The process's default emitter, which the functions below use (made on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Emitter()
    return _default


if TYPE_CHECKING:  # their types; at run time __getattr__ binds them on first use
    emit = Emitter().emit
    op = Emitter().op
    configure = Emitter().configure
    flush = Emitter().flush
    close = Emitter().close


def stats() -> EmitterStats:  # a function: the name is also the submodule emitters.stats
    """The default emitter's figures (Emitter.stats)."""
    return get_emitter().stats()


def __getattr__(name: str) -> Any:
    """emit, op, configure, flush and close: the default emitter's, bound on first use
    and kept in the module, so that later calls look them up as plain attributes."""
    if name in _DEFAULT_FUNCTIONS:
        method = getattr(get_emitter(), name)
        globals()[name] = method
        return method
    raise AttributeError(f"module 'emitters' has no attribute {name!r}")

__all__ = [
    "AGENT_STAMPED",
    "EVENT_FIELDS",
    "KINDS",
    "OP_STATES",
    "REQUIRED",
    "TASK_STATES",
    "Emitter",
    "EmitterStats",
    "Op",
    "close",
    "configure",
    "current_op",
    "emit",
    "flush",
    "get_emitter",
    "op",
    "stats",
]
