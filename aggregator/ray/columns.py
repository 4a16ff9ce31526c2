"""Ray rows as tuples -> one EVENT_SCHEMA record batch, one `pa.array` per column.

A row is a tuple of the ROW_COLUMNS in order: every event column except those the agent
stamps (pid, uid, received), which come from the batch's Stamp. Rows hold values exactly
as `aggregator.decode.normalize.normalize_event` leaves them (checked types, defaults applied),
so a batch built here equals `rows_to_batch` over the same rows. The one exception is
`time`, which may also hold Ray's own RFC 3339 text: UTC with a "Z" and 0-9 fraction
digits ("2026-11-29T12:05:22Z" to "2026-11-29T12:05:22.487696773Z"; protobuf prints 0,
3, 6 or 9). Arrow converts those in one cast, to the same nanoseconds as `normalize`
would; any other text raises TimeTextError, and the caller maps the batch again with
times converted one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain
from typing import Any, Final, cast

import pyarrow as pa
import pyarrow.compute as pc

from aggregator.decode.normalize import Stamp
from emitters.fields import AGENT_STAMPED, EVENT_FIELDS
from sinks.schema import EVENT_SCHEMA, empty_batch

RowTuple = tuple[Any, ...]

ROW_COLUMNS: Final[tuple[str, ...]] = tuple(n for n in EVENT_FIELDS if n not in AGENT_STAMPED)
_MAPS: Final = frozenset(ROW_COLUMNS.index(n) for n in ("metrics", "attrs"))
_TIME: Final = ROW_COLUMNS.index("time")
_TIMESTAMP: Final = EVENT_SCHEMA.field("time").type
# The only text the bulk cast takes: where Arrow's and normalize's parsers agree exactly.
_RAY_TIME: Final = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$"


class TimeTextError(ValueError):
    """A time text the bulk cast does not take: map the batch again, time by time."""


def row_of_event(event: dict[str, Any]) -> RowTuple:
    """A `normalize_event` result as a row tuple."""
    return tuple(event.get(name) for name in ROW_COLUMNS)


def rows_to_record_batch(rows: Sequence[RowTuple], stamp: Stamp) -> pa.RecordBatch:
    if not rows:
        return empty_batch()
    count = len(rows)
    arrays: dict[str, pa.Array] = {}
    for index, (name, column) in enumerate(zip(ROW_COLUMNS, zip(*rows, strict=True),
                                               strict=True)):
        kind = EVENT_SCHEMA.field(name).type
        if column[0] is None and column.count(None) == count:
            arrays[name] = pa.nulls(count, kind)
        elif index in _MAPS:
            arrays[name] = _map_array(column, kind)
        elif index == _TIME:
            arrays[name] = _time_array(column)
        else:
            arrays[name] = pa.array(column, kind)
    arrays["pid"] = pa.nulls(count, pa.int32()) if stamp.pid is None \
        else pa.repeat(pa.scalar(stamp.pid, pa.int32()), count)
    arrays["uid"] = pa.nulls(count, pa.int32()) if stamp.uid is None \
        else pa.repeat(pa.scalar(stamp.uid, pa.int32()), count)
    arrays["received"] = pa.repeat(
        pa.scalar(stamp.received_ns, EVENT_SCHEMA.field("received").type), count)
    return pa.RecordBatch.from_arrays([arrays[f.name] for f in EVENT_SCHEMA],
                                      schema=EVENT_SCHEMA)


def _map_array(column: Sequence[dict[str, Any] | None], kind: pa.DataType) -> pa.Array:
    """Dicts (None for a null map) as one MapArray, built from flat keys and values."""
    maps = cast(Sequence[dict[str, Any]], column)
    try:
        offsets = list(accumulate(map(len, maps), initial=0))
    except TypeError:  # a null map among them
        return pa.array(column, kind)
    keys = list(chain.from_iterable(maps))
    values = list(chain.from_iterable(map(dict.values, maps)))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, kind.key_type),
                                   pa.array(values, kind.item_type), type=kind)


def _time_array(column: Sequence[int | str]) -> pa.Array:
    """Integer ns and Ray's time texts -> a timestamp array; TimeTextError when a text is
    not in Ray's shape, names no real time, or lies outside what the careful path keeps."""
    try:
        texts = pa.array(column, pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):  # some are integers already
        texts = None
    if texts is None:
        at = [i for i, v in enumerate(column) if type(v) is str]
        if not at:
            return pa.array(column, _TIMESTAMP)
        parsed = _parse_times(pa.array([column[i] for i in at], pa.string())).cast(pa.int64())
        merged = list(column)
        for index, ns in zip(at, parsed.to_pylist(), strict=True):
            merged[index] = ns
        return pa.array(merged, _TIMESTAMP)
    return _parse_times(texts)


def _parse_times(texts: pa.Array) -> pa.Array:
    if not pc.all(pc.match_substring_regex(texts, _RAY_TIME)).as_py():
        raise TimeTextError("a time text not in Ray's shape")
    try:
        parsed = texts.cast(_TIMESTAMP)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TimeTextError(str(exc)) from None
    if pc.min(parsed.cast(pa.int64())).as_py() < 0:
        raise TimeTextError("a time before 1970")
    return parsed
