"""Socket frames (NDJSON from our emitter) to an EVENT_SCHEMA batch, in bulk.

The fast path never builds a Python object per event: pyarrow's JSON reader parses the whole
frame in C++ (without the GIL), inferring the types of the fields the frame has (cheaper
than an explicit schema of every column, most of them absent), and the columns are then
checked against EVENT_SCHEMA; the inferred `metrics`/`attrs` structs and unknown top-level
columns become map columns (`decode_maps`). Whatever that path cannot decode exactly as
`aggregator.decode.normalize` would (a bad line, a type conflict, an explicit null inside metrics
or attrs, a number whose text would differ) goes to the careful path, which keeps the good
lines and names each bad one. Both paths give the same columns for the same input; map
entries are sorted by key in both, so the order a producer wrote them in does not matter.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from aggregator.decode.maps import (
    BulkRefused,
    attrs_from_columns,
    is_true,
    metrics_from_struct,
    sort_map_entries,
)
from aggregator.decode.normalize import Normalized, Stamp, ndjson_to_batch
from emitters.fields import AGENT_STAMPED, EARLIEST_TIME_NS
from emitters.ids import new_event_id
from sinks.schema import EVENT_SCHEMA

__all__ = [
    "BulkRefused",
    "decode_bulk",
    "decode_careful",
    "decode_ndjson",
    "fallback_counts",
    "sort_map_entries",
]

_MAP_COLUMNS: Final = ("metrics", "attrs")
_TIMESTAMP: Final = pa.timestamp("ns", tz="UTC")

# The scalar columns as the bulk path types them; `time` arrives as integer nanoseconds.
SCALAR_SCHEMA: Final = pa.schema(
    [
        pa.field(f.name, pa.int64() if f.name == "time" else f.type)
        for f in EVENT_SCHEMA
        if f.name not in _MAP_COLUMNS and f.name not in AGENT_STAMPED
    ]
)
# Inferred types that hold exactly the values the careful path accepts for the field.
_WIDENED: Final[dict[str, tuple[pa.DataType, ...]]] = {
    "attempt": (pa.int64(),),
    "duration_s": (pa.int64(),),
    "nonfinite": (pa.list_(pa.null()),),
}
_INFER_ALL: Final = pj.ParseOptions(unexpected_field_behavior="infer")
_NEWLINE: Final = ord("\n")
_OPEN_BRACE: Final = ord("{")

_fallbacks: Counter[str] = Counter()
_fallbacks_lock = threading.Lock()


def decode_ndjson(payload: bytes, stamp: Stamp) -> Normalized:
    """Decode one frame's NDJSON; bad lines are rejected with a reason, good ones kept."""
    try:
        return Normalized(decode_bulk(payload, stamp))
    except BulkRefused as exc:
        reason = exc.reason
    except pa.ArrowInvalid:
        reason = "arrow_invalid"  # a parse error or a type conflict between lines
    except Exception:  # any surprise: the careful path is always correct, only slower
        reason = "unexpected"
    with _fallbacks_lock:
        _fallbacks[reason] += 1
    return decode_careful(payload, stamp)


def fallback_counts() -> dict[str, int]:
    """Frames sent to the careful path so far, by reason (for self metrics)."""
    with _fallbacks_lock:
        return dict(_fallbacks)


def decode_careful(payload: bytes, stamp: Stamp) -> Normalized:
    """`normalize.ndjson_to_batch` with map entries sorted by key, as the fast path gives them."""
    result = ndjson_to_batch(payload, stamp)
    batch = result.batch
    for name in _MAP_COLUMNS:
        index = batch.schema.get_field_index(name)
        batch = batch.set_column(index, name, sort_map_entries(batch.column(index)))
    result.batch = batch
    return result


def decode_bulk(payload: bytes, stamp: Stamp) -> pa.RecordBatch:
    """The fast path; raises BulkRefused or pyarrow.ArrowInvalid where it cannot decode."""
    lines = _line_count(payload)
    if not payload.isascii():
        _check_utf8(payload)  # the JSON reader does not validate UTF-8 itself
    table = _read(payload, None)
    text_schema = _timestamps_as_text(table.schema)
    if text_schema is not None:
        table = _read(payload, text_schema)
    if table.num_rows != lines:
        raise BulkRefused("line_count")
    columns = _arrays(table)
    columns.update(_typed_scalars(columns, lines))
    _check_scalars(columns)
    metrics = metrics_from_struct(columns.get("metrics"), lines, payload)
    attrs = attrs_from_columns(columns, lines, payload)
    return assemble_stamped(columns, metrics, attrs, stamp, lines)


def _line_count(payload: bytes) -> int:
    """Lines in the frame, when every line starts with '{' (so none is blank or indented).

    Then the reader's row count equals the line count only if each line held one object.
    """
    data = np.frombuffer(payload, dtype=np.uint8)
    breaks = np.flatnonzero(data == _NEWLINE)
    if len(breaks) and breaks[-1] == len(payload) - 1:
        breaks = breaks[:-1]
    if not payload.startswith(b"{") or not (np.take(data, breaks + 1) == _OPEN_BRACE).all():
        raise BulkRefused("layout")
    return len(breaks) + 1


def _check_utf8(payload: bytes) -> None:
    offsets = pa.py_buffer(np.array([0, len(payload)], dtype=np.int32))
    text = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(payload)])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        raise BulkRefused("utf8") from None


def _read(payload: bytes, schema: pa.Schema | None) -> pa.Table:
    if schema is None:
        options = _INFER_ALL
    else:
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    return pj.read_json(
        pa.BufferReader(payload),
        read_options=pj.ReadOptions(use_threads=False, block_size=len(payload) + 1),
        parse_options=options,
    )


def _timestamps_as_text(inferred: pa.Schema) -> pa.Schema | None:
    """The reader turns ISO-looking strings into timestamps; ask for the text instead."""
    text: list[pa.Field] = []
    for field in inferred:
        if field.name == "attrs" and pa.types.is_struct(field.type):
            children = [_text_if_timestamp(child) for child in field.type]
            if children != list(field.type):
                text.append(pa.field("attrs", pa.struct(children)))
        elif pa.types.is_timestamp(field.type):
            text.append(_text_if_timestamp(field))
    return pa.schema(text) if text else None


def _text_if_timestamp(field: pa.Field) -> pa.Field:
    return pa.field(field.name, pa.string()) if pa.types.is_timestamp(field.type) else field


def _arrays(table: pa.Table) -> dict[str, pa.Array]:
    """The table's columns by name (one block, so one batch: no copies)."""
    batches = table.to_batches()
    batch = batches[0] if len(batches) == 1 else table.combine_chunks().to_batches()[0]
    return dict(zip(batch.schema.names, batch.columns, strict=True))


def _typed_scalars(columns: dict[str, pa.Array], rows: int) -> dict[str, pa.Array]:
    """The scalar columns as SCALAR_SCHEMA types from the reader's inferred ones.

    Refuses a type the careful path would reject some value of (a number for a string
    field, a fraction for an integer field, text for `time`...).
    """
    typed: dict[str, pa.Array] = {}
    for field in SCALAR_SCHEMA:
        column = columns.get(field.name)
        if column is None or pa.types.is_null(column.type):
            typed[field.name] = pa.nulls(rows, field.type)
        elif column.type == field.type:
            typed[field.name] = column
        elif column.type in _WIDENED.get(field.name, ()):
            typed[field.name] = _narrow(column, field)
        else:
            raise BulkRefused("field_type")
    return typed


def _narrow(column: pa.Array, field: pa.Field) -> pa.Array:
    # Integers to float64 round as Python's float() does; to int32 they must fit.
    safe = not pa.types.is_floating(field.type)
    try:
        return column.cast(field.type, safe=safe)
    except pa.ArrowInvalid:
        raise BulkRefused("int_range") from None


def _check_scalars(columns: dict[str, pa.Array]) -> None:
    kind = columns["kind"]
    if kind.null_count or _has_empty(kind):
        raise BulkRefused("kind_missing")
    time = columns["time"]
    if time.null_count != len(time) and pc.min(time).as_py() < EARLIEST_TIME_NS:
        raise BulkRefused("time_range")
    duration = columns["duration_s"]
    if not _all_finite(duration):
        raise BulkRefused("duration_nonfinite")  # the reader accepts NaN and Infinity
    if duration.null_count != len(duration) and pc.min(duration).as_py() < 0:
        raise BulkRefused("duration_negative")
    if columns["nonfinite"].flatten().null_count:
        raise BulkRefused("nonfinite_null")


def _has_empty(strings: pa.Array) -> bool:
    """Whether some (non-null) string is empty, from the offsets alone."""
    offsets = np.frombuffer(
        strings.buffers()[1], dtype=np.int32, count=len(strings) + 1, offset=4 * strings.offset
    )
    return bool((offsets[1:] == offsets[:-1]).any())


def _all_finite(numbers: pa.Array) -> bool:
    if not numbers.null_count:
        return bool(np.isfinite(numbers.to_numpy()).all())
    return not is_true(pc.any(pc.invert(pc.is_finite(numbers))))


def assemble_stamped(
    columns: dict[str, pa.Array], metrics: pa.Array, attrs: pa.Array, stamp: Stamp, rows: int
) -> pa.RecordBatch:
    """The batch in EVENT_SCHEMA order, stamped: pid, uid, received; time, event_id,
    node_id and host where the producer left them out (COLUMNS frames use it too)."""
    defaults = {"node_id": stamp.node_id, "host": stamp.host}
    arrays: list[pa.Array] = []
    for field in EVENT_SCHEMA:
        name = field.name
        if name == "metrics":
            arrays.append(metrics)
        elif name == "attrs":
            arrays.append(attrs)
        elif name in ("pid", "uid"):
            arrays.append(_constant_int32(getattr(stamp, name), rows))
        elif name == "received":
            arrays.append(
                pa.array(np.full(rows, stamp.received_ns, dtype=np.int64)).view(_TIMESTAMP)
            )
        elif name == "time":
            arrays.append(_filled(columns["time"], stamp.received_ns).view(_TIMESTAMP))
        elif name == "event_id":
            arrays.append(_fill_event_ids(columns["event_id"]))
        elif defaults.get(name):
            arrays.append(_filled(columns[name], defaults[name]))
        else:
            arrays.append(columns[name])
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


def _filled(column: pa.Array, default: int | str) -> pa.Array:
    if not column.null_count:
        return column
    if column.null_count == len(column):  # the field is absent from the whole frame
        return pa.repeat(pa.scalar(default, column.type), len(column))
    return pc.fill_null(column, default)


def _constant_int32(value: int | None, rows: int) -> pa.Array:
    if value is None:
        return pa.nulls(rows, pa.int32())
    return pa.array(np.full(rows, value, dtype=np.int32))


def _fill_event_ids(ids: pa.Array) -> pa.Array:
    if not ids.null_count:
        return ids
    fresh = pa.array([new_event_id() for _ in range(ids.null_count)], pa.string())
    return pc.replace_with_mask(ids, ids.is_null(), fresh)
