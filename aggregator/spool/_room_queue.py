"""Appends that wait for room in a full spool (when_full = "block").

They are served in arrival order, so one session's frames are stored in the order they
came, and none waits past its `room_wait_s`: then it fails with SpoolFull and nothing is
written. The spool fires `changed` whenever room may have come (a segment freed, a waiter
served or gone)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from aggregator.spool._signal import Signal


class SpoolFull(RuntimeError):
    """No room came for an append within its wait (when_full = "block"): nothing written."""


class RoomQueue:
    def __init__(self, has_room: Callable[[int], bool]) -> None:
        self._has_room = has_room
        self._waiting: deque[object] = deque()
        self._refused_size = 0  # the last record refused for want of room
        self.changed = Signal()

    @property
    def anyone_waiting(self) -> bool:
        return bool(self._waiting)

    @property
    def blocked(self) -> bool:
        """Appends wait for room now, or the last that had to wait gave up and its record
        would still not fit."""
        return bool(self._waiting) or (self._refused_size > 0
                                       and not self._has_room(self._refused_size))

    async def wait(self, size: int, wait_s: float | None,
                   check_open: Callable[[], None]) -> None:
        """Until a record of `size` bytes fits and every earlier waiter is served; raises
        SpoolFull after `wait_s` (None: for as long as it takes), or what `check_open`
        raises once the spool closes."""
        token = object()
        self._waiting.append(token)
        deadline = None if wait_s is None else asyncio.get_running_loop().time() + wait_s
        try:
            while self._waiting[0] is not token or not self._has_room(size):
                if not await self.changed.wait(deadline):
                    self._refused_size = size
                    raise SpoolFull(f"the spool is full (when_full=block) and no room came "
                                    f"within {wait_s:g}s: the sinks are behind")
                check_open()
        finally:
            self._waiting.remove(token)
            self.changed.fire()
