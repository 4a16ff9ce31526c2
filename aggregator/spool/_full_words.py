"""What the log says of a full spool: events dropped for room (`drop_oldest`) and events
waiting for room (`block`), each at most once a minute, with how many and for which
sinks, so a spool that stays full costs a line a minute and an operator learns what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

log = logging.getLogger("evagg.spool")
SAID_EVERY_S: Final = 60.0


class FullSpoolWords:
    def __init__(self) -> None:
        self._dropped_unsaid = 0  # events dropped for room since the log last said so
        self._dropped_behind: set[str] = set()  # the sinks those were not delivered to
        self._later: asyncio.TimerHandle | None = None  # says the held-back drops
        self._dropped_said_at = self._waiting_said_at = -SAID_EVERY_S

    def dropped(self, events: int, behind: list[str]) -> None:
        """`events` went for room; `behind`: the sinks that had not delivered them."""
        self._dropped_unsaid += events
        self._dropped_behind.update(behind)
        wait_s = self._dropped_said_at + SAID_EVERY_S - time.monotonic()
        if wait_s <= 0:
            self.say_dropped()
        elif self._later is None:  # drops that stop within the minute are said at its end
            with contextlib.suppress(RuntimeError):  # no loop: said at the next drop
                self._later = asyncio.get_running_loop().call_later(wait_s, self.say_dropped)

    def say_dropped(self) -> None:
        """Log the drops not said yet (a minute after the last line at the latest)."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if not self._dropped_unsaid:
            return
        count, behind = self._dropped_unsaid, sorted(self._dropped_behind)
        whose = f" not yet delivered to {', '.join(behind)}" if behind else ""
        log.warning("spool full: dropped the oldest %d event%s%s to take new ones "
                    "(when_full=drop_oldest); `evagg status` and a `loss` event count them. "
                    "A larger spool.max_bytes, or sinks that keep up, prevent it",
                    count, "" if count == 1 else "s", whose)
        self._dropped_unsaid, self._dropped_said_at = 0, time.monotonic()
        self._dropped_behind.clear()

    def waiting(self, behind: list[str]) -> None:
        """New events wait for room (when_full=block) until `behind` deliver."""
        now = time.monotonic()
        if now - self._waiting_said_at < SAID_EVERY_S:
            return
        self._waiting_said_at = now
        log.warning("spool full (when_full=block): new events wait until %s deliver%s and "
                    "free room; producers buffer meanwhile, then drop with counts, and HTTP "
                    "senders get 503. A larger spool.max_bytes gives sinks longer",
                    ", ".join(behind) or "the sinks", "s" if len(behind) == 1 else "")
