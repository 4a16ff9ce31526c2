"""The HTTP sink's requests of the last few minutes, and the failed ones by kind.

An endpoint that fails two requests in three and answers the third never fails
DOWN_AFTER requests in a row, so the delivery loop never hears of it (`retries.py`): the
sink retries each failed batch itself, delivers, only slower, and reads as `ok`. The
counts since start (`requests_5xx`, `connect_errors`, ...) tell Prometheus, which keeps
their history; `evagg status` reads the agent once, so the agent keeps the window for it:
the requests of the last WINDOW_S seconds, the failed ones by kind, in one-second
buckets (bounded memory whatever the request rate). The log says it too, once every
SAY_EVERY_S at most, once the failures are many enough to matter.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from sinks.http.retries import RETRIED_KINDS

WINDOW_S: Final = 300  # what `evagg status` and the log line count: the last 5 minutes
# The log says so once this many requests failed in the window, a quarter of them or more:
# one timeout in five minutes is no news; a third of the requests failing is.
SAY_AFTER_FAILED: Final = 10
SAY_SHARE: Final = 0.25
SAY_EVERY_S: Final = 600.0
KINDS: Final = tuple(sorted(RETRIED_KINDS))


@dataclass(slots=True)
class _Second:
    at: int  # monotonic second
    requests: int = 0
    failed: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class RequestWindow:
    """The requests of the window: how many went out, how many failed, by kind."""

    requests: int
    failed: Counter[str]

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    def kinds_text(self) -> str:
        """`http_5xx 38, connect 3`: the most frequent kind first."""
        return ", ".join(f"{kind} {count}" for kind, count in self.failed.most_common())


class RecentRequests:
    """Counts each request as it ends: answered (or refused for good), or failed by kind."""

    def __init__(self, window_s: int = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seconds: deque[_Second] = deque()
        self._said_at = float("-inf")

    def ended(self, failed_kind: str | None) -> None:
        """One request ended; `failed_kind` is its retried failure's kind, else None."""
        now = int(self._clock())
        self._forget_before(now)
        if not self._seconds or self._seconds[-1].at != now:
            self._seconds.append(_Second(now))
        second = self._seconds[-1]
        second.requests += 1
        if failed_kind is not None:
            second.failed[failed_kind] += 1

    def window(self) -> RequestWindow:
        self._forget_before(int(self._clock()))
        failed: Counter[str] = Counter()
        for second in self._seconds:
            failed.update(second.failed)
        return RequestWindow(sum(s.requests for s in self._seconds), failed)

    def gauges(self) -> dict[str, float]:
        """`recent_requests`, `recent_requests_failed` and `recent_failures_<kind>` for
        every kind the sink retries (each present, 0 while none failed)."""
        seen = self.window()
        out = {"recent_requests": float(seen.requests),
               "recent_requests_failed": float(seen.failed_total)}
        out.update({f"recent_failures_{kind}": float(seen.failed[kind]) for kind in KINDS})
        return out

    def worth_saying(self) -> RequestWindow | None:
        """The window, when the log should say it now: enough failures, and not said in
        the last SAY_EVERY_S. None otherwise."""
        now = self._clock()
        if now - self._said_at < SAY_EVERY_S:
            return None
        seen = self.window()
        failed = seen.failed_total
        if failed < SAY_AFTER_FAILED or failed < SAY_SHARE * seen.requests \
                or failed == seen.requests:  # none answered: the delivery loop says that
            return None
        self._said_at = now
        return seen

    def _forget_before(self, now: int) -> None:
        while self._seconds and self._seconds[0].at <= now - self.window_s:
            self._seconds.popleft()
