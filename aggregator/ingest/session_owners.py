"""Which connection carries each producer session's frames now.

A producer sends a session's frames on one connection at a time (docs/wire-protocol.md).
One that had no answer for `ack_timeout` (the spool full under `block`, or its disk
refusing writes) reconnects and resends from its oldest unanswered frame; its earlier
connection, whose handler still waits for the spool to take a frame, is then superseded
and its handler cancelled. Left waiting, such connections piled up, one per producer per
`ack_timeout`, each holding frames in memory, until `max_connections` refused new ones.

A connection of a producer that has gone away is never superseded (nobody reconnects
under its session), so its frames are still stored, or counted at the stop.
"""

from __future__ import annotations

import asyncio

from emitters.wire import NO_SESSION


class SessionOwners:
    def __init__(self) -> None:
        self._owner: dict[bytes, asyncio.Task[None]] = {}
        self._owned: dict[asyncio.Task[None], set[bytes]] = {}

    def claim(self, session: bytes) -> None:
        """The running handler's connection carries `session` now; another connection's
        handler that carried it is cancelled."""
        task = asyncio.current_task()
        if session == NO_SESSION or task is None:
            return
        earlier = self._owner.get(session)
        if earlier is task:
            return
        if earlier is not None:
            self._owned.get(earlier, set()).discard(session)
            if not earlier.done():
                earlier.cancel()
        self._owner[session] = task
        self._owned.setdefault(task, set()).add(session)

    def release(self, task: asyncio.Task[None]) -> None:
        """`task`'s connection has ended: it carries no session any more."""
        for session in self._owned.pop(task, ()):
            if self._owner.get(session) is task:
                del self._owner[session]
