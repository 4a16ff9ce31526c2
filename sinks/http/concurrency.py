"""How many requests the HTTP sink keeps in flight: a limit that follows the endpoint.

Additive increase, multiplicative decrease, in the spirit of Vector's adaptive request
concurrency. The limit starts small and grows by one per round of healthy answers to
requests during which every slot was in use (a round: as many answers as the limit).
It is cut by a quarter when the endpoint pushes back (429, 502-504, a timeout, a
refused or reset connection) or answers far slower than it usually does, at most once
per round trip: the answers to requests sent before the last cut were sent under the
old limit and say nothing new. `max_in_flight` bounds it; a fixed limit never moves.

Slots are handed out first come, first served, except that a batch being retried goes
to the front: it holds the cursor back.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

INITIAL_LIMIT: Final = 2
# Gentler than TCP's half: one 429 among healthy answers must not leave a single slot
# that one slow request then holds for seconds. Four cuts in a row still take 4 to 1.
DECREASE_FACTOR: Final = 0.75
# An answer counts as the endpoint slowing down when it takes SLOW_FACTOR times the usual
# latency and at least SLOW_MARGIN_S more: loopback jitter of a few ms is no signal.
SLOW_FACTOR: Final = 2.0
SLOW_MARGIN_S: Final = 0.2
LATENCY_WEIGHT: Final = 0.2  # of each new answer in the moving average
# One slow answer moves the average at most this many times the average: a single
# stall must not hide the next slowdown, a lasting one is learnt in a dozen answers.
LATENCY_CLIP: Final = 4.0


class Answer(enum.Enum):
    """What one request says about the endpoint's capacity."""

    HEALTHY = "healthy"  # answered (2xx, or a refusal of the batch itself)
    OVERLOADED = "overloaded"  # pushed back: 429, 502-504, timeout, connection trouble
    NEUTRAL = "neutral"  # says nothing about load (500, a local error, not sent)


@dataclass(frozen=True, slots=True)
class Ticket:
    """One slot taken, and when its request started."""

    started: float


class ConcurrencyLimit:
    """Requests in flight, bounded by a limit that adapts unless `fixed` is given."""

    def __init__(self, maximum: int, *, fixed: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if fixed is not None and not 1 <= fixed <= maximum:
            raise ValueError(f"a fixed concurrency must be 1..{maximum}, got {fixed}")
        self.maximum = maximum
        self.adaptive = fixed is None
        self._limit = float(fixed if fixed is not None else min(INITIAL_LIMIT, maximum))
        self._healthy = 0  # healthy answers towards the next increase
        self._clock = clock
        self.in_flight = 0
        self.cuts = 0  # decreases since start
        self.latency_s: float | None = None  # moving average of healthy answers
        self._last_cut = -float("inf")
        self._last_full = -float("inf")  # when every slot was last in use
        self._waiters: deque[asyncio.Future[float]] = deque()  # each gets its grant time

    @property
    def limit(self) -> int:
        return max(1, int(self._limit))

    async def acquire(self, *, retry: bool = False) -> Ticket:
        """Wait for a slot; a retry waits at the front of the queue."""
        if self.in_flight < self.limit and not self._waiters:
            return Ticket(self._occupy())
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if retry:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        try:
            granted = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as we were cancelled
                self.in_flight -= 1
                self._wake()
            elif waiter in self._waiters:  # else a release passed it over, as cancelled
                self._waiters.remove(waiter)
            raise
        return Ticket(granted)

    def release(self, ticket: Ticket, answer: Answer) -> None:
        """The request of `ticket` ended; `answer` is what it said about the endpoint."""
        self.in_flight -= 1
        self._adapt(ticket, answer, self._clock())
        self._wake()

    def _occupy(self) -> float:
        """Take a slot; returns the time it was taken."""
        now = self._clock()
        self.in_flight += 1
        if self.in_flight >= self.limit:
            self._last_full = now
        return now

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._occupy())

    def _adapt(self, ticket: Ticket, answer: Answer, now: float) -> None:
        """Learn the usual latency (a fixed limit too: it is exported) and, when
        adaptive, move the limit."""
        if answer is Answer.OVERLOADED and self.adaptive:
            self._cut(ticket, now)
        elif answer is Answer.HEALTHY:
            latency = now - ticket.started
            slow = self._is_slow(latency)
            self._observe(latency)
            if not self.adaptive:
                return
            if slow:
                self._cut(ticket, now)
            elif self._last_full >= ticket.started:  # every slot was used meanwhile
                self._grow()

    def _is_slow(self, latency: float) -> bool:
        usual = self.latency_s
        return (usual is not None and latency > usual * SLOW_FACTOR
                and latency > usual + SLOW_MARGIN_S)

    def _observe(self, latency: float) -> None:
        usual = self.latency_s
        if usual is None:
            self.latency_s = latency
            return
        sample = min(latency, usual * LATENCY_CLIP) if usual > 0 else latency
        self.latency_s = usual + LATENCY_WEIGHT * (sample - usual)

    def _grow(self) -> None:
        self._healthy += 1
        if self._healthy >= self.limit:  # a round of answers: one more slot
            self._limit, self._healthy = min(float(self.maximum), self._limit + 1.0), 0

    def _cut(self, ticket: Ticket, now: float) -> None:
        if ticket.started < self._last_cut:  # sent under the old limit: already answered
            return
        self._limit = max(1.0, self._limit * DECREASE_FACTOR)
        self._healthy = 0
        self._last_cut = now
        self.cuts += 1
