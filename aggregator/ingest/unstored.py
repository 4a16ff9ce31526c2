"""What an exited producer's frames held when the agent stopped before storing them.

A producer that has exited cannot send its frames again, so those still waiting for
spool room when the agent stops are lost (docs/wire-protocol.md, "A producer that goes
away"). Their events are counted as `unstored_at_stop`; the `loss` events among them (a
producer's last report, sent as it exits, is often one) are not counted as lost events
themselves, but what they report is, under the producer's reasons: otherwise the lake
would never learn of those losses either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pyarrow.compute as pc

from aggregator.decode.columns import ColumnsRefused, decode_columns
from aggregator.decode.ndjson import decode_ndjson
from aggregator.decode.normalize import Stamp
from aggregator.losses import UNSTORED_AT_STOP, reported_losses
from emitters import wire


def unstored_losses(bodies: list[bytes], stored: Callable[[bytes, int], bool],
                    stamp: Stamp) -> tuple[Counter[str], int]:
    """The events lost with `bodies` (frame bodies) by reason, and how many frames the
    spool does not hold (`stored(session, seq)` says which it does)."""
    lost: Counter[str] = Counter()
    frames = 0
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
        reports = reported_losses(batch)
        loss_rows = pc.sum(pc.equal(batch.column("kind"), "loss")).as_py() or 0
        lost[UNSTORED_AT_STOP] += batch.num_rows - loss_rows
        for report in reports:
            lost[report.reason] += report.events
    return +lost, frames
