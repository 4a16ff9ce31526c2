"""Queued items both ways from the sender to the spool: framed as the sender frames them
(emitters.outbox, COLUMNS or NDJSON), then decoded by the agent's own decoders into the
table it would spool. The tests that compare the two frame types share it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aggregator.decode.columns import decode_columns
from aggregator.decode.ndjson import decode_ndjson
from aggregator.decode.normalize import Stamp
from emitters import wire
from emitters.events import Context, build_events
from emitters.outbox import Outbox
from sinks.schema import EVENT_SCHEMA

STAMP = Stamp(1_700_000_000_000_000_000, 4242, 1000, "node-a", "host-a")
# The columns the agent stamps on receipt, which the two frame types need not agree on.
STAMPED = ("pid", "uid", "received")
CONTEXT = Context.of({"job_id": "job-1", "run_id": "run-ü", "attrs": {"team": "ml"}})


def frames(items: list[tuple[Any, ...]], columns: bool, max_frame: int = 1 << 20) -> list[bytes]:
    outbox = Outbox(max_frame, 1 << 30)
    if columns:
        outbox.add_items(items, CONTEXT)  # as the sender frames them
    else:
        list(outbox.add_events(build_events(items, CONTEXT, outbox.lost)))
    list(outbox.close_frame())
    return [frame for frame, _ in outbox.frames.values()]


def spooled(raw_frames: list[bytes]) -> tuple[pa.Table, int]:
    """What the agent would spool of these frames, and how many events it rejected."""
    batches: list[pa.RecordBatch] = []
    rejected = 0
    for raw in raw_frames:
        frame = wire.decode_body(raw[4:])
        if isinstance(frame, wire.Columns):
            result = decode_columns(frame.payload, frame.count, STAMP)
        else:
            assert isinstance(frame, wire.Batch)
            result = decode_ndjson(frame.payload, STAMP)
        batches.append(result.batch)
        rejected += len(result.rejected)
    # no frames at all when the sender refused every event (a `nonfinite` that is no list)
    return pa.Table.from_batches(batches, schema=EVENT_SCHEMA).combine_chunks(), rejected
