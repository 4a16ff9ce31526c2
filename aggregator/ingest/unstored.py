"""What an exited producer's frames held when the agent stopped before storing them.

A producer that has exited cannot send its frames again, so those still waiting for
spool room when the agent stops are lost (docs/wire-protocol.md, "A producer that goes
away"). Their events are counted as `unstored_at_stop`, the agent's loss; the `loss`
events among them (a producer's last report, sent as it exits, is often one) are not
counted as lost events themselves, but are kept as they are, the producer's reports of
its own drops (its reasons, session and running totals): otherwise the lake would never
learn of those losses either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import pyarrow.compute as pc

from aggregator.decode.columns import ColumnsRefused, decode_columns
from aggregator.decode.ndjson import decode_ndjson
from aggregator.decode.normalize import Stamp
from aggregator.losses import ProducerLoss, reported_losses
from emitters import wire


class StoredOrCounted:
    """Whether a frame is stored, or counted lost already at this stop: a producer that
    reconnected just before the stop may have had the same frames waiting on two
    connections (docs/wire-protocol.md, "Resend and dedupe"), and each counts once."""

    def __init__(self, stored: Callable[[bytes, int], bool]) -> None:
        self._stored = stored
        self._counted: set[tuple[bytes, int]] = set()

    def __call__(self, session: bytes, seq: int) -> bool:
        if self._stored(session, seq):
            return True
        if session == wire.NO_SESSION or seq <= 0:  # no identity: each copy is its own
            return False
        if (session, seq) in self._counted:
            return True
        self._counted.add((session, seq))
        return False


class Unstored(NamedTuple):
    """What an exited producer's frames that the spool does not hold lose."""

    frames: int
    events: int  # the agent's loss, `unstored_at_stop`: every event but the `loss` ones
    reports: list[ProducerLoss]  # the producer's own reports of its drops, as it sent them


def unstored_losses(bodies: list[bytes], stored: Callable[[bytes, int], bool],
                    stamp: Stamp) -> Unstored:
    """What `bodies` (frame bodies) lose, of the frames the spool does not hold
    (`stored(session, seq)` says which it does)."""
    events = frames = 0
    reports: list[ProducerLoss] = []
    for body in bodies:
        try:
            frame = wire.decode_body(body)
        except wire.FrameError:
            continue  # refused as malformed had it been handled: no events to lose
        if not isinstance(frame, (wire.Batch, wire.Columns)) or stored(frame.session,
                                                                       frame.seq):
            continue
        frames += 1
        try:
            batch = (decode_columns(frame.payload, frame.count, stamp).batch
                     if isinstance(frame, wire.Columns)
                     else decode_ndjson(frame.payload, stamp).batch)
        except ColumnsRefused:
            continue  # refused whole had it been handled
        reports += reported_losses(batch)
        loss_rows = pc.sum(pc.equal(batch.column("kind"), "loss")).as_py() or 0
        events += batch.num_rows - loss_rows
    return Unstored(frames, events, reports)
