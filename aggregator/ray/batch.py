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

import os
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
from aggregator.ray.json_rows import ColumnarBody

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

    With COLUMNAR_MIN_BYTES set, a body that large goes through the columnar path first
    (`json_columns`, `json_rows`); the events it does not take are parsed and mapped as
    a smaller body is, and every row is in the body's order either way."""
    claim = Claim() if claim is None else claim
    least = COLUMNAR_MIN_BYTES
    columnar = _columnar(body, stamp) if least is not None and len(body) >= least else None
    items = parse_ray_body(body) if columnar is None else _others(columnar, body)
    keys = items if columnar is None else _keys(items, columnar)
    found = recent.split_new(keys, claim)
    try:
        if columnar is None:
            result = ray_items_to_batch([(i, items[i]) for i in found.indexes], stamp)
        else:
            result = merge(columnar, found.indexes, items, stamp)
    except BaseException:
        recent.settle(claim, stored=False)
        raise
    result.claim = claim
    result.pending = found.pending
    result.held = found.held
    result.duplicates = len(items) - len(found.indexes) - found.held
    return result


def _columnar_min_bytes(setting: str | None) -> int | None:
    """EVAGG_RAY_COLUMNAR_MIN_BYTES: bodies of at least this many bytes take the columnar
    path; unset (the default), none do: on our machines it costs more CPU than the fast
    path (docs/performance.md, "The columnar path")."""
    return int(setting) if setting and setting.strip().isdigit() else None


COLUMNAR_MIN_BYTES = _columnar_min_bytes(os.environ.get("EVAGG_RAY_COLUMNAR_MIN_BYTES"))


def _columnar(body: bytes, stamp: Stamp) -> ColumnarBody | None:
    """The body as the columnar path reads it, or None when DuckDB should not read it."""
    try:
        return ColumnarBody(read_events(body), stamp)
    except ColumnarReadError:
        return None


def _others(columnar: ColumnarBody, body: bytes) -> list[Any]:
    """The body's events the columnar path does not take, parsed (None where it does);
    the body parsed whole, to refuse it as before, when one of them is not an object."""
    items: list[Any] = []
    for index, taken_here in enumerate(columnar.taken.tolist()):
        item = None if taken_here else _parsed(columnar.text(index))
        if not taken_here and type(item) is not dict:
            return parse_ray_body(body)  # raises RayBodyError
        items.append(item)
    return items


def _parsed(text: str | None) -> Any:
    try:
        return orjson.loads(text or "null")
    except orjson.JSONDecodeError:
        return None  # JSON only DuckDB reads


def _keys(items: list[Any], columnar: ColumnarBody) -> list[Any]:
    """The dedupe key of each event: the taken ones' eventIds, the other events whole."""
    ids = iter(columnar.event_ids)
    return [next(ids) if taken_here else item
            for item, taken_here in zip(items, columnar.taken.tolist(), strict=True)]


def merge(columnar: ColumnarBody, fresh: list[int], items: list[Any], stamp: Stamp) -> RayBatch:
    """The fresh events' rows: the taken ones' from the columnar path, the others mapped
    as `ray_items_to_batch` maps them, in the body's order."""
    is_fresh = np.zeros(len(items), dtype=bool)
    is_fresh[fresh] = True
    rows, row_events, failed = columnar.rows(is_fresh)
    for index in failed:  # taken, then not convertible after all: the Python path's
        items[index] = _parsed(columnar.text(index))
    python = set(failed) | {i for i in fresh if not columnar.taken[i]}
    others = ray_items_to_batch([(i, items[i]) for i in fresh if i in python], stamp)
    owners = np.concatenate([row_events, np.array(others.row_events, np.int64)])
    order = np.argsort(owners, kind="stable")
    batch = rows
    if others.normalized.batch.num_rows:
        both = pa.Table.from_batches([rows, others.normalized.batch])
        batch = both.take(pa.array(order)).combine_chunks().to_batches()[0]
    others.normalized = Normalized(batch, others.normalized.rejected)
    others.columnar = len(fresh) - len(python)
    others.row_events = owners[order].tolist()
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
