"""What an emitter did so far, as `emitters.stats()` and `Emitter.stats()` report it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """A snapshot of one emitter's counts (docs/emitters.md, "Stats").

    Once flush() returned True, or after close(), every emitted event is in exactly one
    of acked, rejected, dropped or pending: emitted == acked + rejected +
    sum(dropped.values()) + pending. While the sender thread is busy the figures are
    read without stopping it, so they can be a batch apart.

    emitted: events handed to emit(), op() (two per op), enqueue_built or enqueue_deferred,
        dropped ones too.
    sent: events written to the agent, each counted once however often it was resent.
    acked: events the agent took into its spool.
    rejected: events the agent answered as unreadable (its note is logged).
    dropped: events lost before the agent took them, by reason: buffer_full (queue or
        buffer full), too_large, unencodable, nacked, exit_deadline (undelivered when
        close() or exit gave up), closed (emitted after close()).
    refused: the events of `rejected` and `dropped["nacked"]` again, by the agent's
        reason (its words, e.g. "field 'duration_s' must be a number, got str"); a
        frame's refused events count each under its own reason (the agent names up to ten
        a frame; more count under the first).
    pending: events emitted and not yet acked, rejected or dropped.
    connected: whether the sender holds a connection to the agent right now.
    closed: whether close() was called (at exit, it is for every emitter).
    counters: the sender's own diagnostics, for a support question rather than a
        dashboard: sent_frames, acked_frames, columns_frames (made as COLUMNS),
        columns_refused (an agent that predates COLUMNS said so), resent_frames, connects,
        connect_failures, disconnects, ack_timeouts, nacks, bad_replies, stray_replies,
        loss_events (the `loss` reports sent to the agent, not in the figures above),
        sender_errors, unacked_frames, buffered_bytes. Absent keys are 0.
    """

    emitted: int = 0
    sent: int = 0
    acked: int = 0
    rejected: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    pending: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)
    connected: bool = False
    closed: bool = False
    counters: Mapping[str, int] = field(default_factory=dict)

    def at_close(self) -> EmitterStats:
        """The final figures: what is still pending will not be delivered any more."""
        dropped = dict(self.dropped)
        if self.pending:
            dropped["exit_deadline"] = dropped.get("exit_deadline", 0) + self.pending
        return replace(self, dropped=dropped, pending=0, connected=False, closed=True)

    def with_late_drops(self, late: int) -> EmitterStats:
        """These figures plus `late` events emitted (and dropped) after close()."""
        if not late:
            return self
        dropped = {**self.dropped, "closed": self.dropped.get("closed", 0) + late}
        return replace(self, emitted=self.emitted + late, dropped=dropped)
