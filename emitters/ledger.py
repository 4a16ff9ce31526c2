"""What happened to each frame: acked, nacked, lost; flush waiters; loss accounting.

The sender thread alone calls these methods. Losses are counted by reason in the outbox
(`buffer_full`, `nacked`, `too_large`, `unencodable`, `exit_deadline`) plus the events
callers dropped when the queue was full (counted as `buffer_full`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from emitters import wire
from emitters.outbox import Outbox

log = logging.getLogger("evagg.emitter")


class FlushWaiter:
    """Queued by flush(); done once every frame made before it is answered (or given up)."""

    __slots__ = ("at_exit", "done", "ok", "target", "unreachable")

    def __init__(self, at_exit: bool) -> None:
        self.at_exit = at_exit  # at exit, give up at once when no agent listens
        self.done = threading.Event()
        self.ok = False
        self.target = 0
        self.unreachable = False


class RateLimitedLog:
    """Each kind of message at most once a minute, saying how many were held back."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def log(self, level: int, key: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] += 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            message += " (%d more since the last report)"
            args += (held,)
        with contextlib.suppress(Exception):  # logging can fail at interpreter exit
            log.log(level, message, *args)


class Ledger:
    def __init__(self, outbox: Outbox, caller_drops: Callable[[], int]) -> None:
        self.outbox = outbox
        self.counts: Counter[str] = Counter()
        self.log = RateLimitedLog()
        self._caller_drops = caller_drops
        self._reported: Counter[str] = Counter()  # losses already sent in a loss event
        self._warned = 0
        self._waiters: list[FlushWaiter] = []
        self._problems_seen = 0

    def losses(self) -> Counter[str]:
        return self.outbox.lost + Counter({"buffer_full": self._caller_drops()})

    def has_unreported_losses(self) -> bool:
        return sum(self.losses().values()) > sum(self._reported.values())

    def take_unreported(self) -> Counter[str]:
        """Losses not yet in a loss event, now counted as reported."""
        unreported = self.losses() - self._reported
        self._reported += unreported
        return unreported

    def warn_new_losses(self, socket_path: str) -> None:
        totals = self.losses()
        total = sum(totals.values())
        if total > self._warned:
            self._warned = total
            self.log.log(logging.WARNING, "loss", "evagg emitter: %d event(s) dropped so far "
                         "(%s); agent socket %s", total, dict(totals), socket_path)

    def stats(self) -> dict[str, int]:
        out: dict[str, int] = dict(self.counts)
        out.update({f"dropped_{reason}": n for reason, n in self.outbox.lost.items()})
        out["unacked_frames"] = len(self.outbox.frames)
        out["buffered_bytes"] = self.outbox.bytes
        return out

    # -- replies ----------------------------------------------------------------------

    def on_reply(self, reply: wire.Frame) -> bool:
        """Settle the frame a reply answers; True if it answered one still unacked."""
        if isinstance(reply, wire.Ack):
            entry = self._settle(reply.session, reply.seq)
            if entry is None:
                return False  # a second answer to a frame resent after a reconnect
            self.counts["acked_frames"] += 1
            self.counts["acked_events"] += reply.accepted
            if reply.rejected:
                self.counts["rejected_events"] += reply.rejected
                self.log.log(logging.WARNING, "rejected", "evagg agent rejected %d event(s): %s",
                             reply.rejected, reply.note)
            return True
        if isinstance(reply, wire.Nack):
            return self._on_nack(reply)
        raise wire.FrameError("the agent sent a batch frame")

    def _on_nack(self, nack: wire.Nack) -> bool:
        oldest = self.outbox.oldest()
        if nack.session == wire.NO_SESSION and oldest is not None:
            # The agent could not tell which frame it refused; it reads frames in order, so
            # it is the oldest one out. Dropping it keeps a bad frame from looping forever.
            entry = self._settle(self.outbox.session, oldest)
        else:
            entry = self._settle(nack.session, nack.seq)
        if entry is not None:
            self.outbox.lost["nacked"] += entry[1]
        self.counts["nacks"] += 1
        self.log.log(logging.WARNING, "nack", "evagg agent refused a frame: %s", nack.reason)
        return entry is not None

    def _settle(self, session: bytes, seq: int) -> tuple[bytes, int] | None:
        if session != self.outbox.session:
            self.counts["stray_replies"] += 1
            return None
        return self.outbox.settle(seq)

    # -- flush ------------------------------------------------------------------------

    def add_waiter(self, waiter: FlushWaiter) -> None:
        waiter.target = self.outbox.last_seq
        self._waiters.append(waiter)

    def agent_unreachable(self) -> None:
        """A connect failed: flushes at exit stop waiting."""
        for waiter in self._waiters:
            waiter.unreachable = waiter.unreachable or waiter.at_exit

    def settle_waiters(self) -> None:
        if not self._waiters:
            return
        oldest = self.outbox.oldest()
        waiting: list[FlushWaiter] = []
        for waiter in self._waiters:
            if oldest is None or oldest > waiter.target:
                # Good when nothing was lost or rejected since the previous flush ended.
                problems = sum(self.losses().values()) + self.counts["rejected_events"]
                waiter.ok = problems == self._problems_seen
                self._problems_seen = problems
                waiter.done.set()
            elif waiter.unreachable:
                waiter.done.set()
            else:
                waiting.append(waiter)
        self._waiters = waiting
