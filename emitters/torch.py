"""PyTorch training loops: `TrainingTracker` and the profiler's `trace_handler`
(docs/pytorch.md). The code is in emitters/integrations/torch.py."""

from emitters.integrations.torch import TrainingTracker, trace_handler

__all__ = ["TrainingTracker", "trace_handler"]
