"""The emitter's `loss` events about its own drops (docs/wire-protocol.md, "Losses").

While connected, the drops not yet reported go to the agent at most once a second (or at
once when a flush needs them), one event per reason; at close, what was lost and never
told goes in one last frame on a fresh connection. Each is shaped as the agent's own:
name and attrs.reason the reason, metrics.events the count, metrics.events_total the
session's drops for that reason so far (the agent counts by the total what earlier
reports it never read left out).
"""

from __future__ import annotations

import os
import select
import time
from collections import Counter

import orjson

from emitters import wire
from emitters.connection import Connection, ConnectionClosed
from emitters.events import Context, build_events
from emitters.ledger import Ledger
from emitters.outbox import Outbox

LOSS_REPORT_INTERVAL_S = 1.0
LAST_WORD_S = 1.0  # how long the close may spend writing its last loss report


class LossReports:
    def __init__(self, outbox: Outbox, ledger: Ledger) -> None:
        self._outbox = outbox
        self._ledger = ledger
        self._next_report = 0.0

    def report(self, context: Context, force: bool = False) -> int | None:
        """The frame of the drops not yet reported (its seq), if any are and one is due."""
        now = time.monotonic()
        if (now < self._next_report and not force) or not self._ledger.has_unreported_losses():
            return None
        self._next_report = now + LOSS_REPORT_INTERVAL_S
        unreported = self._ledger.take_unreported()
        totals = self._ledger.losses()
        return self._frame({reason: (count, totals[reason])
                            for reason, count in sorted(unreported.items())}, context)

    def last_word(self, context: Context, socket_path: str) -> None:
        """What was lost and not yet told to the agent, in one frame on a fresh
        connection, written and not waited on. The connection in use cannot carry it when
        the agent holds it back (a spool full under `block` stops reading this producer's
        frames), and the process may be about to exit.

        It goes under a session of its own: the agent takes a session's highest stored
        seq for "every frame up to here is stored", and this frame, numbered after the
        frames the agent has not read yet, would be stored before them and make them
        look like resends of frames it holds. The loss events name the emitter's session
        in their attrs, which is what the agent counts totals by."""
        unacked = self._ledger.unacked_losses()
        report = self._frame(unacked, context) if unacked else None
        if report is None:
            return
        try:
            conn = Connection(socket_path)
        except OSError:
            return  # no agent to tell: stats() and the closing words say it
        made = self._outbox.frames[report]
        alone = {report: (wire.encode_batch(os.urandom(wire.SESSION_BYTES), 1, made.events,
                                            wire.payload_of(made.frame)), made.events)}
        try:
            conn.queue((report,))
            deadline = time.monotonic() + LAST_WORD_S
            while conn.wants_write and time.monotonic() < deadline:
                if not conn.write(alone):
                    select.select([], [conn], [], max(0.0, deadline - time.monotonic()))
        except ConnectionClosed:
            pass  # the agent went away meanwhile
        finally:
            conn.close()

    def _frame(self, losses: dict[str, tuple[int, int]], context: Context) -> int | None:
        """A frame of `loss` events, one per reason: (events, the session's total so far)."""
        time_ns = time.time_ns()
        items = [(time_ns, "loss", reason, "DROPPED",
                  {"source": "evagg", "metrics": {"events": events, "events_total": total},
                   "attrs": {"reason": reason, "session": self._outbox.session.hex(),
                             "component": "emitter"}})
                 for reason, (events, total) in losses.items()]
        events = build_events(items, context, self._outbox.lost)
        payload = b"".join(orjson.dumps(event) + b"\n" for event in events)
        seq = self._outbox.add_payload(payload, len(events), force=True)
        self._ledger.report_made(seq, Counter({r: n for r, (n, _) in losses.items()}))
        self._ledger.counts["loss_events"] += len(events)
        return seq
