"""What a sink's delivery looks like from outside while it runs: since when its current
attempt runs, and how many events it delivered per second over the last minute.

Both are kept here, in the delivery loop, once for every sink type. A store that takes
the request and never answers (an S3 upload through a stuck proxy) holds one attempt
until the sink's own timeouts end it, over a minute on S3; no failure is counted
meanwhile, so without the attempt's start the sink reads as `ok` all along. And a sink
delivers in bursts (a Parquet file as it closes, an HTTP batch every batch_interval):
`evagg status` reads the agent over one second, which sees a burst or nothing, so the
agent keeps the minute's average for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

RATE_WINDOW_S: Final = 60  # the delivered rate averages over this many seconds


class DeliveryProgress:
    """A consumer's running attempt and its recent deliveries."""

    def __init__(self, window_s: int = RATE_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock, self._wall_clock = clock, wall_clock
        self._started = clock()  # a rate over less than the window, before it has passed
        self._seconds: deque[list[int]] = deque()  # [monotonic second, events delivered]
        self.attempt_started_at = 0.0  # Unix time the running attempt began; 0: none runs

    def attempt_started(self) -> None:
        self.attempt_started_at = self._wall_clock()

    def attempt_ended(self) -> None:
        self.attempt_started_at = 0.0

    def delivered(self, events: int) -> None:
        now = int(self._clock())
        self._forget_before(now)
        if self._seconds and self._seconds[-1][0] == now:
            self._seconds[-1][1] += events
        else:
            self._seconds.append([now, events])

    def events_per_second(self) -> float:
        """Events delivered per second over the last RATE_WINDOW_S (or since the sink
        started, when that is shorter)."""
        now = self._clock()
        self._forget_before(int(now))
        span = min(float(self.window_s), max(now - self._started, 1.0))
        return sum(events for _, events in self._seconds) / span

    def _forget_before(self, now: int) -> None:
        while self._seconds and self._seconds[0][0] <= now - self.window_s:
            self._seconds.popleft()
