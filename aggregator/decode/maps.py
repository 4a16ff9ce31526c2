"""The `metrics` and `attrs` map columns of the bulk decoder, with entries sorted by key.

From the structs that pyarrow.json infers (one child per key seen in the frame), giving
what `aggregator.decode.normalize` gives after `sort_map_entries`, or refusing.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from emitters.fields import EVENT_FIELDS
from sinks.schema import EVENT_SCHEMA

METRICS_TYPE: Final = EVENT_SCHEMA.field("metrics").type
ATTRS_TYPE: Final = EVENT_SCHEMA.field("attrs").type
_KNOWN: Final = frozenset(EVENT_FIELDS)
_NULL: Final = b"null"


class BulkRefused(Exception):
    """The fast path cannot promise the careful path's result; `reason` is a bounded label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_true(value: pa.Scalar) -> bool:
    return value.as_py() is True


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


def metrics_from_struct(column: pa.Array | None, rows: int, payload: bytes) -> pa.Array:
    """pyarrow.json's inferred `metrics` struct as a float map."""
    if column is None or pa.types.is_null(column.type):
        return pa.nulls(rows, METRICS_TYPE)
    names, children = _struct_children(column, payload)
    values: list[pa.Array] = []
    for child in children:
        if pa.types.is_int64(child.type):
            child = pc.cast(child, pa.float64(), safe=False)
        elif not pa.types.is_float64(child.type):
            raise BulkRefused("metric_type")
        values.append(child)
    if values and not column.null_count and not any(v.null_count for v in values):
        return _dense_metrics(names, values, rows)
    stacked = pa.concat_arrays(values) if values else pa.array([], pa.float64())
    if is_true(pc.any(pc.invert(pc.is_finite(stacked)))):
        raise BulkRefused("metric_nonfinite")  # the careful path moves them to `nonfinite`
    return _entries_map(names, stacked, rows, METRICS_TYPE, column.is_valid())


def _dense_metrics(names: list[str], values: list[pa.Array], rows: int) -> pa.Array:
    """Every row has every metric (the usual frame): rows of the matrix, keys in order."""
    order = sorted(range(len(names)), key=names.__getitem__)
    matrix = np.column_stack([values[i].to_numpy() for i in order])
    if not np.isfinite(matrix).all():
        raise BulkRefused("metric_nonfinite")  # the careful path moves them to `nonfinite`
    width = len(order)
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    keys = _repeated([names[i] for i in order], rows)
    return pa.MapArray.from_arrays(
        pa.array(offsets), keys, pa.array(matrix.ravel()), type=METRICS_TYPE
    )


def _repeated(names: list[str], rows: int) -> pa.Array:
    """`names` once per row, as one string array."""
    encoded = [name.encode() for name in names]
    lengths = np.array([len(e) for e in encoded], dtype=np.int32)
    offsets = np.zeros(rows * len(names) + 1, dtype=np.int32)
    np.cumsum(np.tile(lengths, rows), out=offsets[1:])
    return pa.StringArray.from_buffers(
        rows * len(names), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded) * rows)
    )


def attrs_from_columns(columns: dict[str, pa.Array], rows: int, payload: bytes) -> pa.Array:
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
        return pa.nulls(rows, ATTRS_TYPE)
    stacked = pa.concat_arrays(list(merged.values()))
    return _entries_map(list(merged), stacked, rows, ATTRS_TYPE, None)


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
