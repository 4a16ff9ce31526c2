"""Spans already counted: the RED metrics count a span once however often it arrives.

A span's event_id is fixed by the span (emitters/otel_rows.py `span_event_id`), so the
two copies a provider with both the socket and the OTLP exporter sends, or a batch an
OTLP exporter resends after a timeout, carry one id. The agent stores both copies (it
dedupes frames and Ray events, not events by id; readers dedupe on event_id), and
`SeenSpans` keeps the RED counts to one: it remembers the ids of the last `capacity`
spans measured and drops a span row whose id it holds. A copy that arrives after that
many other spans is counted again; 65,536 spans cover two exporters' 5 s batch delays
at over 10,000 spans a second, in about 6 MB.

Only `span` rows are looked at, one set lookup each; other kinds get fresh random ids
that never repeat, and cost nothing here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DEFAULT_CAPACITY: Final = 65_536
SPAN_KIND: Final = "span"


class SeenSpans:
    """The ids of the last `capacity` span rows measured; not thread-safe (the RED
    metrics call it under their flush lock, one measurement at a time)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._ids: OrderedDict[int, None] = OrderedDict()  # hash of the id, oldest first
        self.skipped = 0  # span rows dropped as already counted, since start

    def first_copies(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` less its span rows already counted (earlier, or higher in the batch)."""
        is_span = pc.fill_null(pc.equal(batch.column("kind"), SPAN_KIND), False)
        span_rows = np.flatnonzero(is_span.to_numpy(zero_copy_only=False))
        if not len(span_rows):
            return batch
        ids = batch.column("event_id").take(pa.array(span_rows)).to_pylist()
        repeated = [row for row, event_id in zip(span_rows.tolist(), ids, strict=True)
                    if event_id is not None and self._seen(event_id)]
        if not repeated:
            return batch
        self.skipped += len(repeated)
        keep = np.ones(batch.num_rows, dtype=bool)
        keep[repeated] = False
        return batch.filter(pa.array(keep))

    def _seen(self, event_id: str) -> bool:
        # A 64-bit hash instead of the 36-character text: a third of the memory, and a
        # false match between two of 65,536 live ids is about one in 10^10.
        key = hash(event_id)
        if key in self._ids:
            return True
        self._ids[key] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return False
