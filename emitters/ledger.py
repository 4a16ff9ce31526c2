"""What happened to each frame: acked, nacked, lost; flush waiters; loss accounting.

The sender thread alone changes the ledger; stats() reads it from any thread. Losses are
counted by reason in the outbox (`buffer_full`, `nacked`, `too_large`, `unencodable`) plus
the events callers dropped when the queue was full (counted as `buffer_full`). The
emitter's own `loss` reports are frames too, kept apart so that they count as none of
the caller's events. A flush that reaches an agent also waits for the report of the
losses before it (docs/wire-protocol.md, "Losses").
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Callable

from emitters import wire
from emitters.outbox import Outbox, PendingFrame
from emitters.ratelimit import RateLimitedLog
from emitters.stats import EmitterStats

log = logging.getLogger("evagg.emitter")
MAX_REASONS = 20
# An agent's note: "event 1: field 'step' ...; event 3: field 'kind' is required", after
# "no event accepted: " in a NACK (aggregator/ingest/unix_socket.py).
_NONE_ACCEPTED = "no event accepted: "
_EVENT_PLACE = re.compile(r"(?:^|; )event \d+: ")


class FlushWaiter:
    """Queued by flush(); done once every frame made before it is answered (or given up)."""

    __slots__ = ("at_exit", "done", "ok", "report_awaited", "target", "unreachable")

    def __init__(self, at_exit: bool) -> None:
        self.at_exit = at_exit  # at exit, give up at once when no agent listens
        self.done = threading.Event()
        self.ok = False
        self.report_awaited = False  # it waits (once) for a loss report (wait_for_report)
        self.target = 0
        self.unreachable = False


class Ledger:
    def __init__(self, outbox: Outbox, caller_drops: Callable[[], int]) -> None:
        self.outbox = outbox
        self.counts: Counter[str] = Counter()
        self.log = RateLimitedLog(log)
        self._caller_drops = caller_drops
        self._reported: Counter[str] = Counter()  # losses already sent in a loss event
        self._warned = 0
        self._waiters: list[FlushWaiter] = []
        self._problems_seen = 0
        self._reports: set[int] = set()  # seqs of the frames holding our `loss` reports
        self._report_counts: dict[int, Counter[str]] = {}  # what each of those reports
        self._acked_reported: Counter[str] = Counter()  # losses in reports the agent acked
        self.refused: Counter[str] = Counter()  # events the agent refused, by its reason

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

    def stats(self, queued: int, connected: bool) -> EmitterStats:
        """The figures so far; `queued`: events still in the callers' queue."""
        # C-level copies first: the sender thread goes on counting meanwhile
        counts = dict(self.counts)
        lost = dict(self.outbox.lost)
        caller_drops = self._caller_drops()
        if caller_drops:
            lost["buffer_full"] = lost.get("buffer_full", 0) + caller_drops
        taken = counts.pop("taken_events", 0)
        return EmitterStats(
            emitted=taken + queued + caller_drops, sent=counts.pop("sent_events", 0),
            acked=counts.pop("acked_events", 0), rejected=counts.pop("rejected_events", 0),
            dropped={reason: n for reason, n in lost.items() if n},
            refused=dict(self.refused),
            pending=queued + self.unacked_events(), connected=connected,
            counters={**counts, "unacked_frames": len(self.outbox.frames),
                      "buffered_bytes": self.outbox.bytes})

    def unacked_events(self) -> int:
        """The caller's events in frames not yet answered (our loss reports left out)."""
        reports = self._reports
        return sum(count for seq, (_, count) in list(self.outbox.frames.items())
                   if seq not in reports)

    def report_made(self, seq: int | None, losses: Counter[str] | None = None) -> None:
        """The frame `seq` holds loss reports (of `losses`), not the caller's events."""
        if seq is not None:
            self._reports.add(seq)
            self._report_counts[seq] = losses or Counter()

    def forget_report(self, seq: int) -> bool:
        """Whether `seq` was a report frame; forgotten unanswered (a frame never sent)."""
        return self._is_report(seq)

    def unacked_losses(self) -> dict[str, tuple[int, int]]:
        """By reason: the drops no acknowledged report told the agent of, and the total
        so far (what a last report says: the agent counts by the total what it missed)."""
        totals = self.losses()
        return {reason: (total - self._acked_reported[reason], total)
                for reason, total in sorted(totals.items())
                if total > self._acked_reported[reason]}

    def count_sent(self, first_sends: list[int]) -> None:
        """Frames written for the first time: count their events as sent."""
        frames = self.outbox.frames
        for seq in first_sends:
            entry = frames.get(seq)
            if entry is not None and seq not in self._reports:
                self.counts["sent_events"] += entry[1]

    def frames_remade(self, removed: list[int], made: list[int], sent_events: int) -> None:
        """Frames made again under new seqs (emitters.outbox.frames_as_ndjson): their
        events count as sent once more when the new frames go out, and a flush waiting
        for a removed frame waits for the new ones."""
        self.counts["sent_events"] -= sent_events
        if not removed or not made:
            return
        for waiter in self._waiters:
            if waiter.target >= min(removed):
                waiter.target = max(waiter.target, max(made))

    # -- replies ----------------------------------------------------------------------

    def on_reply(self, reply: wire.Frame) -> bool:
        """Settle the frame a reply answers; True if it answered one still unacked."""
        if isinstance(reply, wire.Ack):
            entry = self._settle(reply.session, reply.seq)
            if entry is None:
                return False  # a second answer to a frame resent after a reconnect
            self.counts["acked_frames"] += 1
            if self._is_report(reply.seq, acked=True):
                return True
            # Both counts 0 answer a duplicate: a frame resent after a reconnect whose
            # first answer was lost. The agent stored its events the first time.
            duplicate = not reply.accepted and not reply.rejected
            self.counts["acked_events"] += entry.events if duplicate else reply.accepted
            if reply.rejected:
                self.counts["rejected_events"] += reply.rejected
                self._count_refused(reply.note, reply.rejected)
                self.log.log(logging.WARNING, "rejected", "evagg agent rejected %d event(s): %s",
                             reply.rejected, NamedEvents(reply.note, entry))
            return True
        if isinstance(reply, wire.Nack):
            return self._on_nack(reply)
        raise wire.FrameError("the agent sent a batch frame")

    def _on_nack(self, nack: wire.Nack) -> bool:
        session, seq = nack.session, nack.seq
        oldest = self.outbox.oldest()
        if session == wire.NO_SESSION and oldest is not None:
            # The agent could not tell which frame it refused; it reads frames in order, so
            # it is the oldest one out. Dropping it keeps a bad frame from looping forever.
            session, seq = self.outbox.session, oldest
        entry = self._settle(session, seq)
        if entry is not None and not self._is_report(seq):
            if nack.reason.startswith(_NONE_ACCEPTED):
                # Every event of it refused as bad: rejected, as a bad event beside good
                # ones is, not lost (the agent counts them as rejected too).
                self.counts["rejected_events"] += entry[1]
            else:
                self.outbox.lost["nacked"] += entry[1]
            self._count_refused(nack.reason, entry[1])
        self.counts["nacks"] += 1
        reason = NamedEvents(nack.reason, entry) if entry is not None else nack.reason
        self.log.log(logging.WARNING, "nack", "evagg agent refused a frame: %s", reason)
        return entry is not None

    def _count_refused(self, note: str, events: int) -> None:
        """Count a frame's refused events by the agent's reasons: its note names up to
        ten, `event 3: field 'step' ...` joined by "; "; events beyond those count under
        the first. Past MAX_REASONS distinct reasons, the rest count as "other", so a
        producer's texts cannot grow the counts."""
        named = [r for r in _EVENT_PLACE.split(note.removeprefix(_NONE_ACCEPTED)) if r]
        named = (named or ["no reason given"])[:events]
        beyond = [named[0]] * (events - len(named))  # refused, their reasons not sent
        for reason in named + beyond:
            if reason not in self.refused and len(self.refused) >= MAX_REASONS:
                reason = "other"
            self.refused[reason] += 1

    def _is_report(self, seq: int, acked: bool = False) -> bool:
        """Whether a settled frame held loss reports (then forgotten; an acked one's
        losses are known to the agent)."""
        if seq in self._reports:
            self._reports.discard(seq)
            counts = self._report_counts.pop(seq, Counter())
            if acked:
                self._acked_reported += counts
            return True
        return False

    def _settle(self, session: bytes, seq: int) -> PendingFrame | None:
        if session != self.outbox.session:
            self.counts["stray_replies"] += 1
            return None
        return self.outbox.settle(seq)

    # -- flush ------------------------------------------------------------------------

    def add_waiter(self, waiter: FlushWaiter) -> None:
        waiter.target = self.outbox.last_seq
        self._waiters.append(waiter)

    def flushes_due(self) -> list[FlushWaiter]:
        """Flushes that would end now (every frame made before them answered) and have
        not yet waited for a loss report of their own."""
        if not self._waiters:
            return []
        oldest = self.outbox.oldest()
        return [waiter for waiter in self._waiters
                if not waiter.report_awaited and (oldest is None or oldest > waiter.target)]

    def last_unacked_report(self) -> int | None:
        """The seq of the newest loss report the agent has not answered yet."""
        return max(self._reports, default=None)

    def wait_for_report(self, waiters: list[FlushWaiter], seq: int) -> None:
        """`waiters` wait for frame `seq`, a loss report, too. Once: every loss of their
        own frames is known by now, and a later one (another thread's drop) must not keep
        a flush going."""
        for waiter in waiters:
            waiter.target = max(waiter.target, seq)
            waiter.report_awaited = True

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


_REFUSED_EVENT = re.compile(r"\bevent (\d+): ")


class NamedEvents:
    """The agent's reasons with each refused event named by its kind and name ("event 3"
    counts within a frame of many emit() calls, which alone does not say which call),
    made when a log line shows it: a rate-limited line held back costs no read of the
    frame."""

    def __init__(self, note: str, frame: PendingFrame) -> None:
        self.note, self.frame = note, frame

    def __str__(self) -> str:
        wanted = {int(found.group(1)) for found in _REFUSED_EVENT.finditer(self.note)}
        events = self.frame.events_at(wanted) if wanted else {}

        def named(found: re.Match[str]) -> str:
            event = events.get(int(found.group(1)))
            if not isinstance(event, dict):
                return found.group(0)
            what = " ".join(str(event[k]) if k == "kind" else repr(event[k])
                            for k in ("kind", "name") if event.get(k) is not None)
            return f"{found.group(0)[:-2]} ({what}): " if what else found.group(0)
        return _REFUSED_EVENT.sub(named, self.note)
