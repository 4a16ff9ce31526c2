"""Whether the spool's appends fail now, why, and since when.

A disk that fills before the spool's cap (something else on it, or a cap larger than the
disk) refuses every append: producers' frames wait (HTTP posts are refused), but the
spool's own numbers (bytes of the cap) look healthy. This is the one fact /readyz, /metrics
(`evagg_spool_write_failing_since_timestamp_seconds`) and `evagg status` read, so that
each says the disk is the trouble instead of leaving the operator to guess.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass

from aggregator.disk_words import what_to_do


@dataclass(frozen=True)
class WriteFailure:
    since: float  # Unix seconds of the first failed append of this run of failures
    reason: str  # the errno's name (ENOSPC, EDQUOT, EROFS, EIO, ...), the metric's label
    words: str  # the system's words for it ("No space left on device")

    def says(self) -> str:
        """For /readyz and the log: what fails, and what to do."""
        return (f"spool cannot write: {self.words} ({self.reason}); new events wait "
                "(producers' frames are stored once the disk takes them, HTTP posts are "
                f"answered 503 to send again): {what_to_do(self.reason)}")


# A nearly full disk refuses large frames and takes a heartbeat now and then: one append
# that fits is no sign of health. The failure stands until appends succeed with none
# failing for this long.
QUIET_S = 10.0


class WriteHealth:
    """Appends report here: a failure starts (or continues) a run of failures, which ends
    once appends succeed and none has failed for QUIET_S."""

    def __init__(self) -> None:
        self._failure: WriteFailure | None = None
        self._last_failed = 0.0
        self._last_succeeded = 0.0

    @property
    def failure(self) -> WriteFailure | None:
        if (self._failure is not None and self._last_succeeded > self._last_failed
                and time.time() - self._last_failed >= QUIET_S):
            self._failure = None
        return self._failure

    def failed(self, exc: OSError) -> None:
        code = exc.errno or 0
        reason = errno.errorcode.get(code, type(exc).__name__)
        words = exc.strerror or (os.strerror(code) if code else str(exc))
        self._last_failed = time.time()
        since = self._failure.since if self._failure is not None else self._last_failed
        self._failure = WriteFailure(since, reason, words)

    def succeeded(self) -> None:
        self._last_succeeded = time.time()
