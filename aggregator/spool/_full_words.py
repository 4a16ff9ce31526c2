"""What the log says of a full spool: events dropped for room (`drop_oldest`) and events
waiting for room (`block`), each at most once a minute, with how many and for which
sinks, so a spool that stays full costs a line a minute and an operator learns what to do.
"""

from __future__ import annotations

import logging
import time
from typing import Final

log = logging.getLogger("evagg.spool")
SAID_EVERY_S: Final = 60.0


class FullSpoolWords:
    def __init__(self) -> None:
        self._dropped_unsaid = 0  # events dropped for room since the log last said so
        self._dropped_said_at = self._waiting_said_at = -SAID_EVERY_S

    def dropped(self, events: int, behind: list[str]) -> None:
        """`events` went for room; `behind`: the sinks that had not delivered them."""
        self._dropped_unsaid += events
        now = time.monotonic()
        if not self._dropped_unsaid or now - self._dropped_said_at < SAID_EVERY_S:
            return
        count = self._dropped_unsaid
        whose = f" not yet delivered to {', '.join(behind)}" if behind else ""
        log.warning("spool full: dropped the oldest %d event%s%s to take new ones "
                    "(when_full=drop_oldest); `evagg status` and a `loss` event count them. "
                    "A larger spool.max_bytes, or sinks that keep up, prevent it",
                    count, "" if count == 1 else "s", whose)
        self._dropped_unsaid, self._dropped_said_at = 0, now

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
