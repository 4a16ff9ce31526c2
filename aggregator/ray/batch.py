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

import numpy as np
import orjson
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
from aggregator.ray.json_columns import ColumnarReadError, read_events
from aggregator.ray.json_rows import TakenRows, columnar_rows

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
    columnar: int = 0  # events the columnar path mapped (`json_rows`)
    row_events: list[int] = field(default_factory=list)  # each row's event, by its index

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
    None) until the caller settles it; if mapping raises, they are released here.

    A body of COLUMNAR_MIN_BYTES or more goes through the columnar path first
    (`json_columns`, `json_rows`); the events it does not take are parsed and mapped as
    a smaller body is, and every row is in the body's order either way."""
    claim = Claim() if claim is None else claim
    taken = _columnar(body, stamp) if len(body) >= COLUMNAR_MIN_BYTES else None
    items = parse_ray_body(body) if taken is None else _others(taken, body)
    keys = items if taken is None else _keys(items, taken)
    found = recent.split_new(keys, claim)
    try:
        if taken is None:
            result = ray_items_to_batch([(i, items[i]) for i in found.indexes], stamp)
        else:
            result = merge(taken, found.indexes, items, stamp)
    except BaseException:
        recent.settle(claim, stored=False)
        raise
    result.claim = claim
    result.pending = found.pending
    result.held = found.held
    result.duplicates = len(items) - len(found.indexes) - found.held
    return result


COLUMNAR_MIN_BYTES = 32 * 1024  # about 35 of Ray's events; below, Python is as cheap


def _columnar(body: bytes, stamp: Stamp) -> TakenRows | None:
    """The columnar path's rows, or None when DuckDB should not read this body."""
    try:
        return columnar_rows(read_events(body), stamp)
    except ColumnarReadError:
        return None


def _others(taken: TakenRows, body: bytes) -> list[Any]:
    """The body's events the columnar path did not take, parsed (None where it did); the
    body parsed whole, to refuse it as before, when one of them is not a JSON object."""
    texts = iter(taken.others)
    items: list[Any] = []
    for taken_here in taken.taken.tolist():
        if taken_here:
            items.append(None)
            continue
        try:
            item = orjson.loads(next(texts) or b"null")
        except orjson.JSONDecodeError:
            item = None  # JSON only DuckDB reads
        if type(item) is not dict:
            return parse_ray_body(body)  # raises RayBodyError
        items.append(item)
    return items


def _keys(items: list[Any], taken: TakenRows) -> list[Any]:
    """The dedupe key of each event: the taken ones' eventIds, the other events whole."""
    ids = iter(taken.event_ids)
    return [next(ids) if taken_here else item
            for item, taken_here in zip(items, taken.taken.tolist(), strict=True)]


def merge(taken: TakenRows, fresh: list[int], items: list[Any], stamp: Stamp) -> RayBatch:
    """The fresh events' rows: the taken ones' from the columnar path, the others mapped
    as `ray_items_to_batch` maps them, in the body's order."""
    mask = taken.taken.tolist()
    others = ray_items_to_batch([(i, items[i]) for i in fresh if not mask[i]], stamp)
    is_fresh = np.zeros(len(mask), dtype=bool)
    is_fresh[fresh] = True
    keep = is_fresh[taken.row_events]
    columnar = taken.batch.filter(pa.array(keep))
    owners = np.concatenate([taken.row_events[keep], np.array(others.row_events, np.int64)])
    if others.normalized.batch.num_rows:
        both = pa.Table.from_batches([columnar, others.normalized.batch])
        batch = both.take(pa.array(np.argsort(owners, kind="stable"))).combine_chunks() \
            .to_batches()[0]
    else:
        batch = columnar
    others.normalized = Normalized(batch, others.normalized.rejected)
    others.columnar = int(np.count_nonzero(taken.taken[fresh])) if fresh else 0
    others.row_events = owners[np.argsort(owners, kind="stable")].tolist()
    return others


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
    owners: list[int] = []
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
        owners += [index] * (len(rows) - len(owners))
    normalized = Normalized(rows_to_record_batch(rows, stamp), rejected)
    return RayBatch(normalized, careful=careful, declined=declined, row_events=owners)


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
