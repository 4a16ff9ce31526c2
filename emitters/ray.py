"""Ray tasks and actors as evagg ops, and trace context across `.remote()` (docs/ray.md).
The code is in emitters/integrations/ray.py."""

from emitters.integrations.ray import (
    TRACE_KWARG,
    RayOp,
    inject_trace_context,
    ray_ids,
    ray_op,
    trace_kwargs,
    traced_remote,
)

__all__ = ["TRACE_KWARG", "RayOp", "inject_trace_context", "ray_ids", "ray_op",
           "trace_kwargs", "traced_remote"]
