"""A one-shot wake-up that many coroutines can wait on, fired from the event loop's thread
(the spool's "room came" and "data arrived").

Not an asyncio.Event: an Event stays set until someone clears it, and waiters that come
after the fire would pass without cause. Each fire here wakes the waiters of that moment
only; the future is made again on whichever loop waits next (a test may run several)."""

from __future__ import annotations

import asyncio


class Signal:
    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def fire(self) -> None:
        """Wake everyone waiting now."""
        waiting, self._future = self._future, None
        if waiting is None or waiting.done():
            return
        try:
            waiting.set_result(None)
        except RuntimeError:  # its event loop is closed already; nobody is waiting
            return

    async def wait(self, deadline: float | None) -> bool:
        """Until the next fire (True) or the loop's time `deadline` (False); None: no
        deadline. A waiter cancelled does not cancel the others."""
        loop = asyncio.get_running_loop()
        if self._future is None or self._future.get_loop() is not loop:
            self._future = loop.create_future()
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(self._future)
        except TimeoutError:
            return False
        return True
