"""Ray's Event Export bodies into the spool, each event once (docs/ray.md, "Resends").

A body's new eventIds are claimed from the split until the spool write ends: stored, they
are remembered; failed, forgotten (Ray's resend is then stored). A resend that meets ids
another request is still writing waits for that write, at most RAY_RESEND_WAIT_S: if that
write stored them the resend is answered as stored, otherwise `RayResendPending` tells the
route to ask Ray to send again. The transport (the HTTP route) only reads the body and
turns the outcome into an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from aggregator.decode.normalize import Normalized, Stamp
from aggregator.ray.batch import RayBatch, ray_body_to_batch
from aggregator.ray.dedupe import Claim, RecentEventIds
from aggregator.ray.events import RayBodyError

RAY_RESEND_WAIT_S = 2.5  # under Ray's 3 s publish timeout: past it, nobody reads our answer
Stored = TypeVar("Stored")


class RayResendPending(Exception):
    """Some events of the body are another request's, which failed or is still writing."""


class RayIntake(Generic[Stored]):
    """Claim, map, store and settle one Ray body at a time, many bodies at once."""

    def __init__(self, run_in_thread: Callable[..., Awaitable[Any]],
                 store: Callable[[Normalized, Stamp], Awaitable[Stored]]) -> None:
        self._run_in_thread = run_in_thread
        self._store = store
        self.recent_ids = RecentEventIds()

    async def accept(self, body: bytes, stamp: Stamp) -> tuple[Stored, RayBatch]:
        """Store a body's new events. Raises RayBodyError for a body that is not Ray's
        events at all, RayResendPending when Ray should send it again, and whatever the
        store raises (the spool being unavailable)."""
        claim = Claim()
        try:
            mapped: RayBatch = await self._run_in_thread(
                ray_body_to_batch, body, self.recent_ids, stamp, claim)
        except BaseException as exc:
            if not isinstance(exc, RayBodyError):  # cancelled: the thread may still claim ids
                self.recent_ids.settle(claim, stored=False)
            raise
        stored = False
        try:
            result = await self._store(mapped.normalized, stamp)
            stored = True
        finally:
            self.recent_ids.settle(claim, stored)
        if mapped.pending and not await self._stored_by_others(mapped.pending):
            raise RayResendPending("an earlier request with some of these events failed or "
                                   "is still writing them: send again")
        return result, mapped

    async def _stored_by_others(self, pending: list[Claim]) -> bool:
        try:
            async with asyncio.timeout(RAY_RESEND_WAIT_S):
                for claim in pending:
                    if not await self.recent_ids.outcome(claim):
                        return False
        except TimeoutError:
            return False
        return True
