"""RED metrics (rate, errors, duration) derived from the events themselves, for /metrics.

In the spirit of the OpenTelemetry Collector's span-metrics connector: every accepted
batch adds to `evagg_events_total{kind,name,service,state}`, to the histogram
`evagg_event_duration_seconds{kind,name,service}` (from `duration_s` on events that end
something) and to `evagg_event_errors_total{kind,name,service,error_type}`; `service` is
the event's attrs['service.name'], left out where it has none. A span is counted once
however often it arrives (aggregator/red/seen_spans.py).

Batches are kept (five columns, no copy) once they are in the spool, so a refused or
duplicate batch counts nothing, and measured together every `flush_rows` rows (in an
ingest worker thread) or when /metrics is read: `measure` (aggregator/red/measure.py)
groups them with Arrow and numpy, `add` maps the few distinct label values to dense
series ids and adds whole arrays at once (numpy `add.at`) under a lock. Nothing costs
Python work per event; only label interning costs it per distinct (kind, name) of a
measured chunk.

Label values come from producers, so each is capped: kinds, states and services keep the
first values seen, names and error types the first per kind; later ones count as "other"
(a producer's own "other" is the same series).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa

from aggregator.metrics import escape_label
from aggregator.red.measure import MEASURED_COLUMNS, BatchMeasure, Ints, measure
from aggregator.red.seen_spans import SeenSpans

log = logging.getLogger("evagg.red")

DEFAULT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
                          300.0, 900.0, 3600.0, 14400.0)
OTHER: Final = "other"


MAX_LABEL_CHARS = 128  # a longer value (a name is producer text) counts as "other"


class _Labels:
    """Dense ids for label values, at most `limit` per scope, each at most MAX_LABEL_CHARS
    long; the rest is the scope's "other"."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ids: dict[tuple[int, str], int] = {}
        self.labels: list[tuple[int, str]] = []  # id -> (scope, value)
        self.escaped: list[str] = []  # id -> the value escaped for the exposition format
        self._used: dict[int, int] = {}

    def id(self, scope: int, value: str) -> tuple[int, bool]:
        """The value's id and whether it was folded into "other"."""
        found = self.ids.get((scope, value))
        if found is not None:
            return found, False
        used = self._used.get(scope, 0)
        folded = (used >= self.limit or len(value) > MAX_LABEL_CHARS) and value != OTHER
        key = (scope, OTHER if folded else value)
        found = self.ids.get(key)
        if found is None:
            self._used[scope] = used + 1
            found = self.ids[key] = len(self.labels)
            self.labels.append(key)
            self.escaped.append(escape_label(key[1]))
        return found, folded

    def map(self, scopes: Sequence[int], values: Sequence[str]
            ) -> tuple[Ints, np.ndarray[Any, np.dtype[np.bool_]]]:
        """Ids of many values at once, and which of them were folded into "other"."""
        pairs = [self.id(s, v) for s, v in zip(scopes, values, strict=True)]
        return (np.array([p[0] for p in pairs], dtype=np.int64),
                np.array([p[1] for p in pairs], dtype=bool))


def _grown(array: np.ndarray[Any, Any], rows: int) -> np.ndarray[Any, Any]:
    if rows <= len(array):
        return array
    bigger = np.zeros((max(rows, 2 * len(array)), *array.shape[1:]), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


class RedMetrics:
    """Counters and histograms over every accepted event; thread-safe."""

    def __init__(self, *, max_names: int = 200, max_error_types: int = 50, max_kinds: int = 50,
                 max_states: int = 32, max_services: int = 50,
                 buckets: Sequence[float] = DEFAULT_BUCKETS, flush_rows: int = 4096) -> None:
        if min(max_names, max_error_types, max_kinds, max_states, max_services) < 1:
            raise ValueError("label caps must be at least 1")
        self.bounds = np.array(sorted(float(b) for b in buckets), dtype=np.float64)
        self._lock = threading.Lock()
        self._kinds = _Labels(max_kinds)
        self._states = _Labels(max_states)
        self._services = _Labels(max_services)
        self._pairs = _Labels(max_names)  # scope: kind id
        self._error_labels = _Labels(max_error_types)  # scope: kind id
        # A series is one (pair id, service id): its row in the arrays below.
        self._series: dict[tuple[int, int], int] = {}
        self._series_labels: list[tuple[int, int]] = []
        self._counts = np.zeros((64, max_states + 1), dtype=np.int64)  # series x state id
        self._buckets = np.zeros((64, len(self.bounds) + 1), dtype=np.int64)
        self._sums = np.zeros(64, dtype=np.float64)
        self._errors: dict[tuple[int, int], int] = {}  # (series, error label id): failures
        self._capped = dict.fromkeys(("kind", "state", "name", "service", "error_type"), 0)
        self._seen = SeenSpans()
        self._failures: dict[str, int] = {}
        self.flush_rows = flush_rows
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._flush_lock = threading.Lock()  # one measurement at a time; render waits for it

    def add_batch(self, batch: pa.RecordBatch) -> bool:
        """Take a spooled batch (its five columns, no copy); True when a flush is due.

        Measuring costs a few dozen Arrow and numpy calls whatever the size, so small
        batches are measured together: at `flush_rows` rows, or when /metrics is read.
        Never raises: deriving metrics must never cost an event.
        """
        try:
            columns = batch.select(MEASURED_COLUMNS)
        except Exception as exc:
            self._failed(exc)
            return False
        with self._lock:
            self._pending.append(columns)
            self._pending_rows += columns.num_rows
            return self._pending_rows >= self.flush_rows

    def flush(self) -> None:
        """Measure what is pending as one batch and add it; from any thread, never raises."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending, self._pending_rows = self._pending, [], 0
            if not sum(b.num_rows for b in pending):
                return
            try:
                batch = pending[0] if len(pending) == 1 else pa.concat_batches(pending)
                batch = self._seen.first_copies(batch)
                if batch.num_rows:
                    self.add(measure(batch, self.bounds))
            except Exception as exc:
                self._failed(exc)

    def observe(self, batch: pa.RecordBatch) -> None:
        """Add one batch and measure at once (tests, tools); the agent uses add_batch."""
        self.add_batch(batch)
        self.flush()

    def _failed(self, exc: Exception) -> None:
        reason = type(exc).__name__
        with self._lock:
            first = not self._failures
            self._failures[reason] = self._failures.get(reason, 0) + 1
        if first:
            log.exception("RED metrics: a batch could not be measured (counted, not retried)")

    def add(self, part: BatchMeasure) -> None:
        with self._lock:
            kind_ids, kind_folded = self._kinds.map([0] * len(part.kinds), part.kinds)
            state_ids, state_folded = self._states.map([0] * len(part.states), part.states)
            service_ids, service_folded = self._services.map([0] * len(part.services),
                                                              part.services)
            pair_ids, pair_folded = self._pairs.map(kind_ids[part.pair_kind].tolist(),
                                                    [part.names[m] for m in part.pair_name])
            series = self._series_ids(pair_ids, service_ids[part.pair_service])
            self._counts = _grown(self._counts, len(self._series_labels))
            self._buckets = _grown(self._buckets, len(self._series_labels))
            self._sums = _grown(self._sums, len(self._series_labels))
            np.add.at(self._counts, (series[part.count_pair], state_ids[part.count_state]),
                      part.count_events)
            np.add.at(self._buckets, series[part.duration_pair], part.duration_buckets)
            np.add.at(self._sums, series[part.duration_pair], part.duration_sums)
            events = part.count_events
            self._capped["kind"] += int(events[kind_folded[part.pair_kind][part.count_pair]].sum())
            self._capped["name"] += int(events[pair_folded[part.count_pair]].sum())
            self._capped["service"] += int(
                events[service_folded[part.pair_service][part.count_pair]].sum())
            self._capped["state"] += int(events[state_folded[part.count_state]].sum())
            if len(part.error_events):
                self._add_errors(part, kind_ids, series)

    def _series_ids(self, pair_ids: Ints, service_ids: Ints) -> Ints:
        """The series row of each (pair, service) of a batch, made on first sight."""
        out = []
        for key in zip(pair_ids.tolist(), service_ids.tolist(), strict=True):
            row = self._series.get(key)
            if row is None:
                row = self._series[key] = len(self._series_labels)
                self._series_labels.append(key)
            out.append(row)
        return np.array(out, dtype=np.int64)

    def _add_errors(self, part: BatchMeasure, kind_ids: Ints, series: Ints) -> None:
        # Failures are few: a dict per (series, error type) costs less than arrays would.
        error_ids, error_folded = self._error_labels.map(
            kind_ids[part.pair_kind[part.error_pair]].tolist(),
            [part.error_types[e] for e in part.error_type])
        for key in zip(series[part.error_pair].tolist(), error_ids.tolist(),
                       part.error_events.tolist(), strict=True):
            self._errors[key[:2]] = self._errors.get(key[:2], 0) + key[2]
        self._capped["error_type"] += int(part.error_events[error_folded].sum())

    def render(self) -> str:
        """Prometheus text (exposition format 0.0.4) of every RED family."""
        self.flush()
        with self._lock:
            lines = self._count_lines() + self._histogram_lines() + self._error_lines()
            capped = dict(self._capped)
            failures = dict(self._failures)
        lines += _header("evagg_red_capped_events_total", "counter",
                         'Events whose label value was replaced by "other", by label.')
        lines += [f'evagg_red_capped_events_total{{label="{k}"}} {v}' for k, v in capped.items()]
        lines += _header("evagg_red_errors_total", "counter",
                         "Batches that could not be measured for RED metrics, by exception.")
        lines += [f'evagg_red_errors_total{{type="{escape_label(k)}"}} {v}'
                  for k, v in sorted(failures.items())]
        return "\n".join(lines) + "\n"

    def _pair_labels(self, series: int) -> str:
        pair, service = self._series_labels[series]
        kind_id, _ = self._pairs.labels[pair]
        labels = f'kind="{self._kinds.escaped[kind_id]}",name="{self._pairs.escaped[pair]}"'
        if self._services.labels[service][1]:  # no service.name: no label, as Prometheus reads ""
            labels += f',service="{self._services.escaped[service]}"'
        return labels

    def _count_lines(self) -> list[str]:
        lines = _header("evagg_events_total", "counter",
                        "Events accepted, by kind, name, service and state (capped labels).")
        used = self._counts[: len(self._series_labels)]
        pairs, states = np.nonzero(used)
        for pair, state, value in zip(pairs.tolist(), states.tolist(),
                                      used[pairs, states].tolist(), strict=True):
            lines.append(f'evagg_events_total{{{self._pair_labels(pair)},'
                         f'state="{self._states.escaped[state]}"}} {value}')
        return lines

    def _histogram_lines(self) -> list[str]:
        name = "evagg_event_duration_seconds"
        lines = _header(name, "histogram",
                        "Duration of events that end something, from duration_s.")
        bounds = [repr(b) for b in self.bounds.tolist()] + ["+Inf"]
        used = self._buckets[: len(self._series_labels)]
        for pair in np.flatnonzero(used.any(axis=1)).tolist():
            labels = self._pair_labels(pair)
            cumulative = np.cumsum(used[pair]).tolist()
            for le, count in zip(bounds, cumulative, strict=True):
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}')
            lines.append(f"{name}_sum{{{labels}}} {float(self._sums[pair])!r}")
            lines.append(f"{name}_count{{{labels}}} {cumulative[-1]}")
        return lines

    def _error_lines(self) -> list[str]:
        lines = _header("evagg_event_errors_total", "counter",
                        "Failed events, by kind, name, service and error type (capped labels).")
        for (series, error), count in sorted(self._errors.items()):
            lines.append(f"evagg_event_errors_total{{{self._pair_labels(series)},"
                         f'error_type="{self._error_labels.escaped[error]}"}} {count}')
        return lines


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
