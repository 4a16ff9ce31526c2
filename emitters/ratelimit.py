"""A log that says each kind of message at most once an interval, then how many it held.

A flood (every connection failing on a full disk, every batch refused) is one problem,
not thousands of lines. The emitter, the agent's socket ingest and the HTTP sink share
it; it lives here, with the standard library only, so the producer side can use it too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from typing import Any


class RateLimitedLog:
    """Each kind of message (its `key`) at most once per `interval_s`."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()
        # the latest message held back per key: said at the interval's end (say_held), so a
        # burst that ends within the minute is said whole
        self._latest: dict[str, tuple[int, str, tuple[Any, ...]]] = {}

    def log(self, level: int, key: str, message: str, *args: Any,
            exc_info: BaseException | None = None) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] += 1
            self._latest[key] = (level, message, args)
            return
        self._last[key] = now
        self._latest.pop(key, None)
        held = self._held.pop(key, 0)
        if held:
            message += " (%d more since the last report)"
            args += (held,)
        with contextlib.suppress(Exception):  # logging can fail at interpreter exit
            self._logger.log(level, message, *args, exc_info=exc_info)

    def say_held(self, *, force: bool = False) -> None:
        """Say the messages held back whose interval has ended: the latest of each kind,
        with how many like it. Call it now and then (a sink's flush): a burst that ended
        within the minute was otherwise never said past its first line. `force`: every
        one now (at close)."""
        now = time.monotonic()
        for key in [k for k, last in self._last.items()
                    if self._held.get(k) and (force or now - last >= self._interval)]:
            level, message, args = self._latest.pop(key)
            held = self._held.pop(key)
            self._last[key] = now
            with contextlib.suppress(Exception):
                self._logger.log(level, message + " (%d like it since the last report)",
                                 *args, held)
