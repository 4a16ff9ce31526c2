"""Socket frames (NDJSON from our emitter) to an EVENT_SCHEMA batch, in bulk.

The fast path never builds a Python object per event: pyarrow's JSON reader parses the whole
frame in C++ (without the GIL) with an explicit schema for the scalar columns, and the
inferred `metrics`/`attrs` structs and unknown top-level columns become map columns through
numpy and pyarrow.compute. Whatever that path cannot decode exactly as
`aggregator.normalize` would (a bad line, a type conflict, an explicit null inside metrics
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

from aggregator.normalize import Normalized, Stamp, ndjson_to_batch
from emitters.fields import AGENT_STAMPED, EVENT_FIELDS
from emitters.ids import new_event_id
from sinks.schema import EVENT_SCHEMA

_MAP_COLUMNS: Final = ("metrics", "attrs")
_TIMESTAMP: Final = pa.timestamp("ns", tz="UTC")
_METRICS_TYPE: Final = EVENT_SCHEMA.field("metrics").type
_ATTRS_TYPE: Final = EVENT_SCHEMA.field("attrs").type
_KNOWN: Final = frozenset(EVENT_FIELDS)

# The scalar columns as the reader parses them; `time` arrives as integer nanoseconds.
SCALAR_SCHEMA: Final = pa.schema(
    [
        pa.field(f.name, pa.int64() if f.name == "time" else f.type)
        for f in EVENT_SCHEMA
        if f.name not in _MAP_COLUMNS and f.name not in AGENT_STAMPED
    ]
)
_NEWLINE: Final = ord("\n")
_OPEN_BRACE: Final = ord("{")
_NULL: Final = b"null"

_fallbacks: Counter[str] = Counter()
_fallbacks_lock = threading.Lock()


class BulkRefused(Exception):
    """The fast path cannot promise the careful path's result; `reason` is a bounded label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
    table = _read(payload, SCALAR_SCHEMA)
    text_schema = _timestamps_as_text(table.schema)
    if text_schema is not None:
        table = _read(payload, text_schema)
    if table.num_rows != lines:
        raise BulkRefused("line_count")
    columns = {name: _one_array(table.column(name)) for name in table.column_names}
    _check_scalars(columns)
    metrics = _metrics_map(columns.get("metrics"), lines, payload)
    attrs = _attrs_map(columns, lines, payload)
    return _assemble(columns, metrics, attrs, stamp, lines)


def _line_count(payload: bytes) -> int:
    """Lines in the frame, when every line starts with '{' (so none is blank or indented).

    Then the reader's row count equals the line count only if each line held one object.
    """
    data = np.frombuffer(payload, dtype=np.uint8)
    line_starts = data[1:][data[:-1] == _NEWLINE]
    if not payload.startswith(b"{") or not (line_starts == _OPEN_BRACE).all():
        raise BulkRefused("layout")
    return len(line_starts) + 1


def _check_utf8(payload: bytes) -> None:
    offsets = pa.py_buffer(np.array([0, len(payload)], dtype=np.int32))
    text = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(payload)])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        raise BulkRefused("utf8") from None


def _read(payload: bytes, schema: pa.Schema) -> pa.Table:
    return pj.read_json(
        pa.BufferReader(payload),
        read_options=pj.ReadOptions(use_threads=False, block_size=len(payload) + 1),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
    )


def _timestamps_as_text(inferred: pa.Schema) -> pa.Schema | None:
    """The reader turns ISO-looking strings into timestamps; ask for the text instead."""
    extra: list[pa.Field] = []
    for field in inferred:
        if field.name == "attrs" and pa.types.is_struct(field.type):
            children = [_text_if_timestamp(child) for child in field.type]
            if children != list(field.type):
                extra.append(pa.field("attrs", pa.struct(children)))
        elif field.name not in _KNOWN and pa.types.is_timestamp(field.type):
            extra.append(_text_if_timestamp(field))
    if not extra:
        return None
    return pa.schema([*SCALAR_SCHEMA, *extra])


def _text_if_timestamp(field: pa.Field) -> pa.Field:
    return pa.field(field.name, pa.string()) if pa.types.is_timestamp(field.type) else field


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _is_true(value: pa.Scalar) -> bool:
    return value.as_py() is True


def _check_scalars(columns: dict[str, pa.Array]) -> None:
    kind = columns["kind"]
    if kind.null_count or _is_true(pc.any(pc.equal(pc.binary_length(kind), 0))):
        raise BulkRefused("kind_missing")
    if _is_true(pc.any(pc.less(columns["time"], 0))):
        raise BulkRefused("time_range")
    if _is_true(pc.any(pc.invert(pc.is_finite(columns["duration_s"])))):
        raise BulkRefused("duration_nonfinite")  # the reader accepts NaN and Infinity
    if columns["nonfinite"].flatten().null_count:
        raise BulkRefused("nonfinite_null")


def _struct_children(column: pa.Array, payload: bytes) -> tuple[list[str], list[pa.Array]]:
    """Children with the parent's nulls merged in; refuses explicit nulls inside the object."""
    if not pa.types.is_struct(column.type):
        raise BulkRefused("not_an_object")
    children: list[pa.Array] = column.flatten()
    # A child null in a non-null row is an absent key or an explicit null; only the
    # careful path can tell which, and it treats them differently.
    if any(child.null_count > column.null_count for child in children) and _has_null(payload):
        raise BulkRefused("null_in_object")
    return [field.name for field in column.type], children


def _has_null(payload: bytes) -> bool:
    """Whether the text `null` occurs: a vectorized scan, faster than `bytes.find` here."""
    data = np.frombuffer(payload, dtype=np.uint8)
    at = np.flatnonzero(data[:-3] == _NULL[0])
    second, third, fourth = (data[at + i] == _NULL[i] for i in (1, 2, 3))
    return bool((second & third & fourth).any())


def _metrics_map(column: pa.Array | None, rows: int, payload: bytes) -> pa.Array:
    if column is None or pa.types.is_null(column.type):
        return pa.nulls(rows, _METRICS_TYPE)
    names, children = _struct_children(column, payload)
    values: list[pa.Array] = []
    for child in children:
        if pa.types.is_int64(child.type):
            child = pc.cast(child, pa.float64(), safe=False)
        elif not pa.types.is_float64(child.type):
            raise BulkRefused("metric_type")
        values.append(child)
    stacked = pa.concat_arrays(values) if values else pa.array([], pa.float64())
    if _is_true(pc.any(pc.invert(pc.is_finite(stacked)))):
        raise BulkRefused("metric_nonfinite")  # the careful path moves them to `nonfinite`
    return _entries_map(names, stacked, rows, _METRICS_TYPE, column.is_valid())


def _attrs_map(columns: dict[str, pa.Array], rows: int, payload: bytes) -> pa.Array:
    """Unknown top-level fields and `attrs` as one string map; `attrs` wins on a clash."""
    merged: dict[str, pa.Array] = {
        name: _as_text(column)
        for name, column in columns.items()
        if name not in _KNOWN and not pa.types.is_null(column.type)
    }
    attrs = columns.get("attrs")
    if attrs is not None and not pa.types.is_null(attrs.type):
        for name, child in zip(*_struct_children(attrs, payload), strict=True):
            text = _as_text(child)
            merged[name] = pc.coalesce(text, merged[name]) if name in merged else text
    if not merged:
        return pa.nulls(rows, _ATTRS_TYPE)
    stacked = pa.concat_arrays(list(merged.values()))
    return _entries_map(list(merged), stacked, rows, _ATTRS_TYPE, None)


def _as_text(column: pa.Array) -> pa.Array:
    """Strings as they are; integers and booleans as the JSON text the careful path keeps."""
    if pa.types.is_string(column.type):
        return column
    if pa.types.is_int64(column.type) or pa.types.is_boolean(column.type):
        return pc.cast(column, pa.string())
    raise BulkRefused("attr_type")  # floats, lists, objects: their text form would differ


def _entries_map(
    names: list[str],
    stacked: pa.Array,
    rows: int,
    map_type: pa.DataType,
    row_valid: pa.Array | None,
) -> pa.Array:
    """One map per row from the values of each key, stacked key after key.

    A row's entries are its non-null values, keys sorted. Rows are null where `row_valid`
    is false, or (without it) where they have no entries.
    """
    width = len(names)
    order = np.array(sorted(range(width), key=names.__getitem__), dtype=np.int64)
    valid = stacked.is_valid().to_numpy(zero_copy_only=False)
    present = valid.reshape(width, rows).T[:, order]  # rows x keys, keys in sorted order
    counts = present.sum(axis=1)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    row_of, rank = np.divmod(np.flatnonzero(present), max(width, 1))
    key_of = order[rank]
    items = stacked.take(pa.array(key_of * rows + row_of))
    keys = pa.array(names, pa.string()).take(pa.array(key_of))
    mask = pa.array(counts == 0) if row_valid is None else pc.invert(row_valid)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, items, type=map_type, mask=mask)


def sort_map_entries(column: pa.Array) -> pa.Array:
    """The same maps with each row's entries ordered by key."""
    offsets = column.offsets.to_numpy()
    start, end = int(offsets[0]), int(offsets[-1])
    if end - start < 2:
        return column
    # pc.list_parent_indices aborts the process on a MapArray (pyarrow 26): use numpy.
    rows = np.repeat(np.arange(len(column)), np.diff(offsets))
    keys = column.keys.slice(start, end - start)
    order = pc.sort_indices(
        pa.table({"row": rows, "key": keys}), sort_keys=[("row", "ascending"), ("key", "ascending")]
    )
    return pa.MapArray.from_arrays(
        pa.array(offsets - start, pa.int32()),
        keys.take(order),
        column.items.slice(start, end - start).take(order),
        type=column.type,
        mask=column.is_null(),
    )


def _assemble(
    columns: dict[str, pa.Array], metrics: pa.Array, attrs: pa.Array, stamp: Stamp, rows: int
) -> pa.RecordBatch:
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
            arrays.append(pc.fill_null(columns["time"], stamp.received_ns).view(_TIMESTAMP))
        elif name == "event_id":
            arrays.append(_fill_event_ids(columns["event_id"]))
        elif defaults.get(name) and columns[name].null_count:
            arrays.append(pc.fill_null(columns[name], defaults[name]))
        else:
            arrays.append(columns[name])
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


def _constant_int32(value: int | None, rows: int) -> pa.Array:
    if value is None:
        return pa.nulls(rows, pa.int32())
    return pa.array(np.full(rows, value, dtype=np.int32))


def _fill_event_ids(ids: pa.Array) -> pa.Array:
    if not ids.null_count:
        return ids
    fresh = pa.array([new_event_id() for _ in range(ids.null_count)], pa.string())
    return pc.replace_with_mask(ids, ids.is_null(), fresh)
