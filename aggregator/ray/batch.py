"""One POST body of Ray's Event Export -> one EVENT_SCHEMA batch, in one pass.

The /ray/events route runs `ray_body_to_batch` in a worker thread: parse (orjson), drop
the events Ray resends or that another request is writing now (`RecentEventIds`), map
each event to row tuples and build the Arrow columns directly (`columns.py`). Task
definition and lifecycle events, nearly all of the traffic, take the fast path
(`fast.py`); every other event, and any task event the fast path declines, takes the
careful path (`events.careful_rows`, then `normalize.normalize_event`), which also
names the reason for each event or row it refuses. Both paths give the same rows for the
same event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from aggregator.decode.normalize import EventError, Normalized, Stamp, normalize_event
from aggregator.ray.columns import (
    RowTuple,
    TimeTextError,
    row_of_event,
    rows_to_record_batch,
)
from aggregator.ray.dedupe import Claim, RecentEventIds
from aggregator.ray.events import RayValueError, careful_rows, parse_ray_body
from aggregator.ray.fast import OtherEventType, fast_rows

# What the fast path may raise for an event it cannot take; the careful path then decides.
_DECLINED = (ValueError, TypeError, AttributeError, KeyError, IndexError)


@dataclass(slots=True)
class RayBatch:
    """The rows of one body's new events, and what the route settles once they are spooled.

    `careful`, `declined` and `times_one_by_one` say which slower paths the body took; the
    route counts them (evagg_ray_careful_events_total, evagg_ray_time_remaps_total)."""

    normalized: Normalized
    claim: Claim = field(default_factory=Claim)  # the fresh ids, in flight until settled
    duplicates: int = 0  # events dropped as stored already (or repeated in the body)
    pending: list[Claim] = field(default_factory=list)  # other requests writing the rest
    held: int = 0  # events dropped because one of `pending` is writing them
    careful: int = 0  # events that took the careful path
    declined: int = 0  # of those, task events the fast path declined (odd shape or value)
    times_one_by_one: bool = False  # a time text the bulk cast does not take was there

    @property
    def batch(self) -> pa.RecordBatch:
        return self.normalized.batch

    @property
    def fresh_ids(self) -> list[str]:
        """eventIds to `RecentEventIds.settle` (or `confirm`) after the spool write."""
        return self.claim.ids


def ray_body_to_batch(body: bytes, recent: RecentEventIds, stamp: Stamp,
                      claim: Claim | None = None) -> RayBatch:
    """Raises RayBodyError when the body is not a JSON array of objects (nothing of it is
    to be stored); otherwise rejects only the events (or rows) it cannot read, by their
    index in the body. The new events' ids are in flight under `claim` (a new one if
    None) until the caller settles it; if mapping raises, they are released here."""
    items = parse_ray_body(body)
    claim = Claim() if claim is None else claim
    found = recent.split_new(items, claim)
    try:
        result = ray_items_to_batch([(index, items[index]) for index in found.indexes], stamp)
    except BaseException:
        recent.settle(claim, stored=False)
        raise
    result.claim = claim
    result.pending = found.pending
    result.held = found.held
    result.duplicates = len(items) - len(found.indexes) - found.held
    return result


def ray_items_to_batch(items: list[tuple[int, Any]], stamp: Stamp) -> RayBatch:
    """(index, Ray event) pairs -> one batch; rejections are named by those indexes."""
    try:
        return _map_items(items, stamp, eager=False)
    except TimeTextError:  # a time the bulk cast does not take: convert them one by one
        result = _map_items(items, stamp, eager=True)
        result.times_one_by_one = True
        return result


def _map_items(items: list[tuple[int, Any]], stamp: Stamp, eager: bool) -> RayBatch:
    rows: list[RowTuple] = []
    rejected: list[tuple[int, str]] = []
    careful = declined = 0
    for index, item in items:
        try:
            rows += fast_rows(item, stamp, eager)
        except OtherEventType:
            careful += 1
            _careful(index, item, stamp, rows, rejected)
        except _DECLINED:
            careful += 1
            declined += 1
            _careful(index, item, stamp, rows, rejected)
    normalized = Normalized(rows_to_record_batch(rows, stamp), rejected)
    return RayBatch(normalized, careful=careful, declined=declined)


def _careful(index: int, item: Any, stamp: Stamp, rows: list[RowTuple],
             rejected: list[tuple[int, str]]) -> None:
    try:
        mapped = careful_rows(item)
    except RayValueError as exc:
        rejected.append((index, str(exc)))
        return
    for row in mapped:
        try:
            rows.append(row_of_event(normalize_event(row, stamp)))
        except EventError as exc:  # one row of the event; its other rows are kept
            rejected.append((index, str(exc)))
