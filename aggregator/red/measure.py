"""One batch of events measured for the RED metrics: grouped, not yet added anywhere.

`measure` groups a batch's columns (`MEASURED_COLUMNS`) with Arrow and numpy by
(kind, service, name) (the service is attrs['service.name'], "" without one), that and
the state, duration bucket, and that and the error type, so nothing costs Python work
per event. The result holds batch-local label values and arrays over
the groups; aggregator/red/metrics.py adds them to its series. A duration counts only
on events that end something; an event fails when its state is FAILED or it names an
error type (none named: "unknown"), but a span fails by its state alone (its status).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# States that report progress, not an end: a duration on them would count an entity twice.
IN_PROGRESS_STATES: Final = frozenset({"PENDING", "SUBMITTED", "RUNNING", "STARTED",
                                       "ENQUEUED", "DEFINED", "SCHEDULED", "CREATED"})
FAILED_STATES: Final = frozenset({"FAILED"})
# Kinds whose error_type alone is no failure. An OTel span that recorded an exception it
# handled (a retry that then worked) keeps it in its error columns, yet its status is
# not ERROR: the Collector's span-metrics connector counts it as no error, and so here.
STATUS_ONLY_KINDS: Final = frozenset({"span"})
UNKNOWN_ERROR: Final = "unknown"
MEASURED_COLUMNS: Final = ("kind", "name", "state", "duration_s", "error_type", "attrs",
                           "event_id")
SERVICE_KEY: Final = "service.name"
_DENSE_LIMIT: Final = 1 << 16  # group keys up to this many: bincount, else sort (np.unique)

Ints = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(slots=True)
class BatchMeasure:
    """One batch grouped: label values by batch-local index, and arrays over groups."""

    kinds: list[str]
    names: list[str]
    states: list[str]
    services: list[str]
    pair_kind: Ints  # per distinct (kind, service, name) in the batch: index into kinds
    pair_name: Ints  # ... into names
    pair_service: Ints  # ... and into services
    count_pair: Ints  # per (pair, state) group: index into the pairs
    count_state: Ints  # ... into states
    count_events: Ints
    duration_pair: Ints  # per pair with durations: index into the pairs
    duration_buckets: Ints  # one row per duration_pair, events per bucket, +Inf last
    duration_sums: np.ndarray[Any, np.dtype[np.float64]]
    error_types: list[str]
    error_pair: Ints  # per (pair, error type) group: index into the pairs
    error_type: Ints  # ... into error_types
    error_events: Ints


class _Codes:
    """A string column as dense codes plus its distinct values (null becomes `null_as`)."""

    __slots__ = ("codes", "size", "values")

    def __init__(self, column: pa.Array, null_as: str = "") -> None:
        if column.null_count == len(column):
            self.codes: Ints = np.zeros(len(column), dtype=np.int64)
            raw: list[str | None] = [None]
        else:
            encoded = pc.dictionary_encode(column, null_encoding="encode")
            self.codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            raw = encoded.dictionary.to_pylist()
        self.values = [null_as if v is None else v for v in raw]
        self.size = len(self.values)

    def lookup(self, chosen: frozenset[str]) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Per row: whether its value is in `chosen` (decided once per distinct value)."""
        return np.array([v in chosen for v in self.values], dtype=bool)[self.codes]


def _group(keys: Ints, space: int) -> tuple[Ints, Ints, Ints]:
    """Distinct keys in [0, space), their counts, and each key's group index."""
    if space <= _DENSE_LIMIT:
        counts = np.bincount(keys, minlength=space)
        present = np.flatnonzero(counts)
        index = np.zeros(space, dtype=np.int64)
        index[present] = np.arange(len(present))
        return present, counts[present], index[keys]
    present, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return present, counts, inverse.astype(np.int64)


def measure(batch: pa.RecordBatch, bounds: np.ndarray[Any, np.dtype[np.float64]]) -> BatchMeasure:
    """Group one batch by (kind, service, name), with the state, bucket and error type."""
    kind = _Codes(batch.column("kind"))
    name = _Codes(batch.column("name"))
    state = _Codes(batch.column("state"))
    service = _Codes(pc.map_lookup(batch.column("attrs"), SERVICE_KEY, "first"))
    names_and_services = name.size * service.size
    pair_keys, _, row_pair = _group(
        kind.codes * names_and_services + service.codes * name.size + name.codes,
        kind.size * names_and_services)
    count_keys, count_events, _ = _group(row_pair * state.size + state.codes,
                                         len(pair_keys) * state.size)
    width = len(bounds) + 1
    buckets = np.zeros((0, width), dtype=np.int64)
    sums: np.ndarray[Any, Any] = np.zeros(0, dtype=np.float64)
    duration_pair = np.zeros(0, dtype=np.int64)
    column = batch.column("duration_s")
    if column.null_count < len(column):
        seconds = column.to_numpy(zero_copy_only=False)  # nulls become NaN
        rows = np.flatnonzero(~state.lookup(IN_PROGRESS_STATES) & (seconds >= 0))
        if len(rows):
            seconds = seconds[rows]
            pairs = row_pair[rows]
            bucket = np.searchsorted(bounds, seconds, side="left")  # first bound >= value
            all_buckets = np.bincount(pairs * width + bucket, minlength=len(pair_keys) * width)
            duration_pair = np.flatnonzero(np.bincount(pairs, minlength=len(pair_keys)))
            buckets = all_buckets.reshape(len(pair_keys), width)[duration_pair]
            sums = np.bincount(pairs, seconds, minlength=len(pair_keys))[duration_pair]
    error_types, error_keys, error_events = _errors(batch, row_pair, len(pair_keys), state,
                                                    kind)
    return BatchMeasure(
        kind.values, name.values, state.values, service.values,
        pair_keys // names_and_services, pair_keys % name.size,
        (pair_keys // name.size) % service.size,
        count_keys // state.size, count_keys % state.size, count_events, duration_pair,
        buckets.astype(np.int64), sums, error_types,
        error_keys // max(len(error_types), 1), error_keys % max(len(error_types), 1),
        error_events)


def _errors(batch: pa.RecordBatch, row_pair: Ints, pairs: int,
            state: _Codes, kind: _Codes) -> tuple[list[str], Ints, Ints]:
    column = batch.column("error_type")
    failed = state.lookup(FAILED_STATES)
    if column.null_count < len(column):
        named = column.is_valid().to_numpy(zero_copy_only=False)
        failed |= named & ~kind.lookup(STATUS_ONLY_KINDS)
    rows = np.flatnonzero(failed)
    if not len(rows):
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    error = _Codes(column.take(pa.array(rows)), null_as=UNKNOWN_ERROR)  # failures are few
    keys, events, _ = _group(row_pair[rows] * error.size + error.codes, pairs * error.size)
    return error.values, keys, events
