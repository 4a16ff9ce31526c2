"""Spool records for the HTTP sink's tests, and delivering them as the delivery loop does
(write, flush, abandon after a failure), against a real endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from aggregator.decode.normalize import Stamp, rows_to_batch
from sinks.base import Sink, SinkResult
from sinks.records import SpoolRecord
from sinks.schema import batch_to_bytes


def make_records(count: int, per_record: int, first_offset: int = 1,
                 row: Callable[[int], dict[str, Any]] | None = None) -> list[SpoolRecord]:
    records = []
    for r in range(count):
        rows = [(row or record_row)(r * per_record + i) for i in range(per_record)]
        batch = rows_to_batch(rows, Stamp.now("node-1", "host-1", pid=42, uid=1000)).batch
        records.append(SpoolRecord(first_offset + r, bytes(16), r, time.time_ns(),
                                   batch.num_rows, batch_to_bytes(batch)))
    return records


def record_row(i: int) -> dict[str, Any]:
    """The i-th event of make_records' records, unless a test passes its own `row`."""
    return {"kind": ("task", "op", "span")[i % 3], "source": ("ray", "torch")[i % 2],
            "name": f"step_{i % 5}", "state": "FINISHED", "step": i,
            "metrics": {"loss": i / 7}, "attrs": {"rank": str(i % 8)}}


async def deliver(sink: Sink, records: Sequence[SpoolRecord],
                  attempts: int = 10) -> list[SinkResult]:
    """Deliver every record as the loop would; return the failures met on the way."""
    cursor, last = records[0].offset - 1, records[-1].offset
    failures: list[SinkResult] = []
    for _ in range(attempts):
        result = await sink.write([r for r in records if r.offset > cursor])
        while result.ok:
            if result.durable_through is not None:
                assert result.durable_through >= cursor, "the cursor never goes back"
                cursor = result.durable_through
            if cursor >= last:
                return failures
            result = await sink.flush(final=True)
            assert not (result.ok and result.durable_through is None), "final flush stalled"
        failures.append(result)
        await sink.abandon()
    raise AssertionError(f"not delivered after {attempts} attempts: {failures}")
