"""Ends of the attempts, ops, jobs and actors whose process died without a terminal event.

Public face: `LivenessWatch` (the agent's worker). docs/ray.md and docs/emitters.md say
what a user sees.
"""

from aggregator.liveness.watch import LivenessWatch

__all__ = ["LivenessWatch"]
