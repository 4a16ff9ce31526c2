"""Retries of one batch inside the HTTP sink, and when the endpoint counts as down.

A batch whose request failed in a way the endpoint may get over (a 429, a 5xx, a
timeout, a refused or reset connection) waits out its own backoff (exponential, full
jitter, never sooner than Retry-After) and goes again alone, with the same key and the
same rows, while the other batches carry on. Only when requests fail DOWN_AFTER times
in a row, whichever batches they carried, does the sink hand the failure to the
delivery loop, whose backoff is for a sink that is down; so do failures that are no
passing trouble of the endpoint (bad credentials, a dead letter that cannot be written).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from sinks.backoff import backoff_delay
from sinks.base import SinkResult

RETRIED_KINDS: Final = frozenset({"throttled", "http_5xx", "timeout", "connect"})
# Failed requests in a row after which the endpoint is down. One in three requests
# failing at random makes four in a row rare (1 in 81), and four quick failures are few
# requests to spend on an endpoint that is down.
DOWN_AFTER: Final = 4
BATCH_BACKOFF_BASE_S: Final = 0.1


def retried_here(failure: SinkResult) -> bool:
    """True for a failure the sink retries itself, batch by batch."""
    return not failure.permanent and failure.error_kind in RETRIED_KINDS


@dataclass(slots=True)
class BatchRetry:
    """One batch's failed attempts and the backoff before its next one."""

    cap_s: float
    failures: int = 0

    def delay_after(self, failure: SinkResult) -> float:
        """Seconds to wait before sending the batch again after `failure`."""
        self.failures += 1
        return backoff_delay(self.failures, BATCH_BACKOFF_BASE_S, self.cap_s,
                             retry_after=failure.retry_after_s)


@dataclass(slots=True)
class FailureStreak:
    """Requests failed in a row, across batches; one answered request ends the streak."""

    count: int = 0
    since: float = 0.0  # wall-clock time of the streak's first failure; 0 while answered

    def failed(self) -> None:
        if not self.count:
            self.since = time.time()
        self.count += 1

    def answered(self) -> None:
        self.count = 0
        self.since = 0.0

    @property
    def down(self) -> bool:
        return self.count >= DOWN_AFTER
