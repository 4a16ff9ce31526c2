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

from emitters.emitter import Emitter
from emitters.fields import AGENT_STAMPED, EVENT_FIELDS, KINDS, OP_STATES, REQUIRED, TASK_STATES
from emitters.ops import Op, current_op
from emitters.stats import EmitterStats

_default = Emitter()


def get_emitter() -> Emitter:
    """The process's default emitter, which the functions below use."""
    return _default


emit = _default.emit
op = _default.op
configure = _default.configure
flush = _default.flush
close = _default.close
stats = _default.stats

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
