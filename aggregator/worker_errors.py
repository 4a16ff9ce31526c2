"""The one guard of the agent's background workers (the heartbeat, the liveness watch, the
drain's progress lines, the agent-on-demand poll, the Ray log follower, the artifact
shipper, each sink's consumer and gauges).

A worker catches an ordinary exception where it can go on, and hands it here: it is
counted by worker and type in `evagg_worker_errors_total` (the EvaggWorkerErrors alert),
and logged with its traceback at most once a minute per place and type, saying how many
came meanwhile, so a failure that repeats every second is one line a minute, not a flood.
Cancellation is never caught: it is a BaseException, and the workers let it pass.
"""

from __future__ import annotations

import logging

from aggregator.metrics import AgentMetrics
from emitters.ratelimit import RateLimitedLog


class WorkerErrors:
    """What one worker (or a family of them, as the sinks' consumers) met and went on from."""

    def __init__(self, metrics: AgentMetrics, logger: logging.Logger,
                 interval_s: float = 60.0) -> None:
        self._metrics = metrics
        self._said = RateLimitedLog(logger, interval_s)

    def failed(self, worker: str, exc: BaseException, message: str, *args: object,
               level: int = logging.ERROR, count: int = 1) -> None:
        """Count `exc` (`count` times: a batch of unreadable records is one call) and log
        `message % args` with the exception's type and text, once a minute at the most."""
        kind = type(exc).__name__
        self._metrics.worker_errors.inc(count, worker=worker, type=kind)
        # one line a minute per place (its message) and type of failure
        self._said.log(level, f"{worker}:{kind}:{message}", message + " (%s: %s)", *args,
                       kind, exc, exc_info=exc)
