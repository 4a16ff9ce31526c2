"""Spans already counted: the RED metrics count a span once however often it arrives.

A span's event_id is fixed by the span (emitters/integrations/otel_rows.py `span_event_id`), so the
two copies a provider with both the socket and the OTLP exporter sends, or a batch an
OTLP exporter resends after a timeout, carry one id. The agent stores both copies (it
dedupes frames and Ray events, not events by id; readers dedupe on event_id), and
`SeenSpans` keeps the RED counts to one: it remembers the ids of the last `capacity`
spans measured and drops a span row whose id it holds. A copy that arrives after that
many other spans is counted again; 65,536 spans cover two exporters' 5 s batch delays
at over 10,000 spans a second, in under 10 MB.

Only `span` rows are looked at, with set algebra over each measured chunk's ids (no
Python step per span unless some id repeats); other kinds get fresh random ids that
never repeat, and cost nothing here.
"""

from __future__ import annotations

from collections import deque
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
        self._ids: set[str] = set()
        self._order: deque[str] = deque()  # the same ids, oldest first
        self.skipped = 0  # span rows dropped as already counted, since start

    def first_copies(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` less its span rows already counted (earlier, or higher in the batch)."""
        is_span = pc.fill_null(pc.equal(batch.column("kind"), SPAN_KIND), False)
        span_rows = np.flatnonzero(is_span.to_numpy(zero_copy_only=False))
        if not len(span_rows):
            return batch
        ids = [i for i in batch.column("event_id").take(pa.array(span_rows)).to_pylist() if i]
        fresh = set(ids).difference(self._ids)  # set algebra: C speed, no Python per id
        self._remember(fresh)
        if len(fresh) == len(ids):
            return batch  # the common case: every span new, none twice in the batch
        return self._drop_repeats(batch, span_rows, fresh)

    def _drop_repeats(self, batch: pa.RecordBatch, span_rows: np.ndarray,
                      fresh: set[str]) -> pa.RecordBatch:
        # Rare: some copy met before, or twice in this batch. Keep each fresh id's first row.
        ids = batch.column("event_id").take(pa.array(span_rows)).to_pylist()
        keep = np.ones(batch.num_rows, dtype=bool)
        for row, event_id in zip(span_rows.tolist(), ids, strict=True):
            if event_id is None:
                continue
            if event_id in fresh:
                fresh.discard(event_id)
            else:
                keep[row] = False
        self.skipped += int((~keep).sum())
        return batch.filter(pa.array(keep))

    def _remember(self, fresh: set[str]) -> None:
        self._ids.update(fresh)
        self._order.extend(fresh)
        over = len(self._order) - self.capacity
        if over > 0:
            self._ids.difference_update([self._order.popleft() for _ in range(over)])
