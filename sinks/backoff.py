"""How long to wait before trying again: exponential backoff with full jitter.

A uniform draw between zero and the exponential ceiling spreads the retries of many
agents that failed together, so a recovering endpoint is not hit in lockstep. A peer's
Retry-After is a floor: we never come back sooner than it asked. The delivery loop uses
it for a sink that is down; the HTTP sink uses it for one batch that failed.
"""

from __future__ import annotations

import random
from collections.abc import Callable

MAX_RETRY_AFTER_S = 3600.0  # a peer asking for more than an hour is more likely wrong


def backoff_delay(
    attempt: int,
    base: float = 0.1,
    cap: float = 60.0,
    retry_after: float | None = None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number `attempt` (1 for the first retry).

    The ceiling doubles with each attempt from `base` up to `cap`; the delay is drawn
    uniformly below it. `retry_after`, when given, is a lower bound (itself at most
    MAX_RETRY_AFTER_S), even above `cap`: the peer knows its own state better.
    """
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base overflows nothing, cap bounds it
    ceiling = min(cap, base * (2.0**exponent))
    delay = rng() * max(ceiling, 0.0)
    if retry_after is not None:
        delay = max(delay, min(max(retry_after, 0.0), MAX_RETRY_AFTER_S))
    return delay


