"""COLUMNS frames (our emitter's Arrow-layout batches) to an EVENT_SCHEMA batch.

No Python object per event: the column table is read with bounds checks against the
frame before anything is allocated, the buffers are zero-copy slices of the frame
wrapped with `pyarrow.Array.from_buffers`, and Arrow's full validation checks offsets
and UTF-8. Then the rules the NDJSON path applies per line are applied per column
(`kind` present and not empty, `time` not before 1970, finite numbers), map entries are
sorted by key as the NDJSON path gives them, and the batch is stamped as NDJSON frames
are. Only our emitter writes COLUMNS, so a frame that fails any check is refused whole:
ColumnsRefused names the column and the reason. Layout: docs/wire-protocol.md.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggregator.decode.maps import sort_map_entries
from aggregator.decode.ndjson import SCALAR_SCHEMA, assemble_stamped
from aggregator.decode.normalize import Normalized, Stamp
from emitters.columns import ALIGN, BUFFERS, COLUMN_COUNT, HEADER, LENGTH, MAX_EXPANSION, ROWS
from emitters.fields import AGENT_STAMPED, EARLIEST_TIME_NS, EVENT_FIELDS
from sinks.schema import EVENT_SCHEMA

_WIDTH: Final = {"int32": 4, "int64": 8, "float64": 8, "timestamp_ns": 8}
_ARROW: Final[dict[str, pa.DataType]] = {
    **{f.name: f.type for f in SCALAR_SCHEMA},
    "metrics": EVENT_SCHEMA.field("metrics").type,
    "attrs": EVENT_SCHEMA.field("attrs").type,
}
_PRODUCER_COLUMNS: Final = {n: k for n, k in EVENT_FIELDS.items() if n not in AGENT_STAMPED}


class ColumnsRefused(Exception):
    """The frame cannot be stored; str() is the NACK's reason."""

    def __init__(self, column: str | None, reason: str) -> None:
        where = f"column {column!r}: " if column else ""
        super().__init__(f"COLUMNS frame refused: {where}{reason}")


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    kind: str
    rows: int
    lengths: tuple[int, ...]


def decode_columns(payload: bytes, count: int, stamp: Stamp) -> Normalized:
    """One COLUMNS frame (the bytes after its 30-byte header) as a stamped batch."""
    if count < 1:
        raise ColumnsRefused(None, "the event count is 0")
    entries, start = _read_table(payload, count)
    data = pa.py_buffer(payload)
    arrays: dict[str, pa.Array] = {}
    for entry in entries:
        buffers, start = _slices(data, start, entry)
        arrays[entry.name] = _wrap(entry, buffers)
    if start != len(payload):
        raise ColumnsRefused(None, f"the buffers end at byte {start} of a {len(payload)}-byte "
                             "column section (each is padded to a multiple of 8)")
    _check_expansion(entries, arrays, count, len(payload))
    columns = {name: _expand(array, count) for name, array in arrays.items()}
    _check_values(columns)
    for field in SCALAR_SCHEMA:
        if field.name not in columns:
            columns[field.name] = pa.nulls(count, field.type)
    metrics = _sorted_map(columns.pop("metrics", None), "metrics", count)
    attrs = _sorted_map(columns.pop("attrs", None), "attrs", count)
    return Normalized(assemble_stamped(columns, metrics, attrs, stamp, count))


def _read_table(payload: bytes, count: int) -> tuple[list[_Entry], int]:
    """The column table; the offset where the buffers start."""
    reader = _Reader(payload)
    ncols = reader.unpack(COLUMN_COUNT, None)[0]
    if ncols > len(_PRODUCER_COLUMNS):
        raise ColumnsRefused(None, f"{ncols} columns declared, there are "
                             f"{len(_PRODUCER_COLUMNS)}")
    entries: dict[str, _Entry] = {}
    for _ in range(ncols):
        entry = _read_entry(reader, count)
        if entry.name in entries:
            raise ColumnsRefused(entry.name, "sent twice")
        entries[entry.name] = entry
    for required in ("time", "kind"):
        if required not in entries:
            raise ColumnsRefused(required, "missing")
    if entries["time"].rows != count:
        raise ColumnsRefused("time", "must hold one value per event")
    return list(entries.values()), reader.at + (-(HEADER + reader.at) % ALIGN)


def _read_entry(reader: _Reader, count: int) -> _Entry:
    name = reader.text(None)
    expected = _PRODUCER_COLUMNS.get(name)
    if expected is None:
        why = "stamped by the agent" if name in AGENT_STAMPED else "no such column"
        raise ColumnsRefused(name, why)
    kind = reader.text(name)
    if kind not in BUFFERS:
        raise ColumnsRefused(name, f"no such type {kind!r}")
    if kind != expected:
        raise ColumnsRefused(name, f"type {kind}, the event schema says {expected}")
    rows = reader.unpack(ROWS, name)[0]
    if rows not in (1, count):
        raise ColumnsRefused(name, f"{rows} rows in a frame of {count} events")
    nbuf = reader.unpack(_U8, name)[0]
    if nbuf != len(BUFFERS[kind]):
        raise ColumnsRefused(name, f"{nbuf} buffers, a {kind} column has {len(BUFFERS[kind])}")
    lengths = tuple(reader.unpack(LENGTH, name)[0] for _ in range(nbuf))
    return _Entry(name, kind, rows, lengths)


_U8: Final = struct.Struct(">B")


class _Reader:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.at = 0

    def unpack(self, layout: struct.Struct, column: str | None) -> tuple[int, ...]:
        if self.at + layout.size > len(self.payload):
            raise ColumnsRefused(column, "the column table runs past the frame")
        values = layout.unpack_from(self.payload, self.at)
        self.at += layout.size
        return values

    def text(self, column: str | None) -> str:
        length = self.unpack(_U8, column)[0]
        raw = self.payload[self.at : self.at + length]
        if len(raw) != length:
            raise ColumnsRefused(column, "the column table runs past the frame")
        self.at += length
        if not raw.isascii():
            raise ColumnsRefused(column, "a column or type name that is not ASCII")
        return raw.decode("ascii")


def _slices(data: pa.Buffer, start: int, entry: _Entry) -> tuple[list[pa.Buffer], int]:
    out: list[pa.Buffer] = []
    for role, length in zip(BUFFERS[entry.kind], entry.lengths, strict=True):
        if start + length > data.size:
            raise ColumnsRefused(entry.name, f"its {role} buffer runs past the frame")
        out.append(data.slice(start, length))
        start += length + (-length % ALIGN)
    return out, start


def _wrap(entry: _Entry, buffers: list[pa.Buffer]) -> pa.Array:
    """The column as an Arrow array, after checking every buffer length it implies."""
    rows, name = entry.rows, entry.name
    validity = _validity(buffers[0], rows, name)
    if entry.kind in _WIDTH:
        _expect(buffers[1], rows * _WIDTH[entry.kind], name, "values")
        arrow_type = pa.int64() if name == "time" else _ARROW[name]
        array = pa.Array.from_buffers(arrow_type, rows, [validity, buffers[1]])
    elif entry.kind == "string":
        array = pa.Array.from_buffers(pa.string(), rows, [validity, *_string(buffers[1:], rows,
                                                                               name, "")])
    elif entry.kind == "list_string":
        items = _last_offset(buffers[1], rows, name, "offsets")
        child = pa.Array.from_buffers(pa.string(), items, [None, *_string(buffers[2:4], items,
                                                                          name, "item_")])
        array = pa.Array.from_buffers(_ARROW[name], rows, [validity, buffers[1]], children=[child])
    else:
        array = _wrap_map(entry, validity, buffers)
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ColumnsRefused(name, str(exc)[:200]) from None
    return array


def _wrap_map(entry: _Entry, validity: pa.Buffer | None, buffers: list[pa.Buffer]) -> pa.Array:
    name, map_type = entry.name, _ARROW[entry.name]
    entries = _last_offset(buffers[1], entry.rows, name, "offsets")
    keys = pa.Array.from_buffers(pa.string(), entries,
                                 [None, *_string(buffers[2:4], entries, name, "key_")])
    if entry.kind == "map_string_float64":
        _expect(buffers[4], entries * 8, name, "values")
        items = pa.Array.from_buffers(pa.float64(), entries, [None, buffers[4]])
    else:
        items = pa.Array.from_buffers(pa.string(), entries,
                                      [None, *_string(buffers[4:6], entries, name, "value_")])
    pairs = pa.StructArray.from_arrays([keys, items],
                                       fields=[map_type.key_field, map_type.item_field])
    return pa.Array.from_buffers(map_type, entry.rows, [validity, buffers[1]], children=[pairs])


def _validity(buffer: pa.Buffer, rows: int, name: str) -> pa.Buffer | None:
    if buffer.size == 0:
        return None
    if rows == 1:
        raise ColumnsRefused(name, "a constant column cannot be null (leave it out)")
    _expect(buffer, (rows + 7) // 8, name, "validity")
    return buffer


def _expect(buffer: pa.Buffer, size: int, name: str, role: str) -> None:
    if buffer.size != size:
        raise ColumnsRefused(name, f"its {role} buffer holds {buffer.size} bytes, "
                             f"{size} expected")


def _string(buffers: list[pa.Buffer], rows: int, name: str, role: str) -> list[pa.Buffer]:
    end = _last_offset(buffers[0], rows, name, f"{role}offsets")
    _expect(buffers[1], end, name, f"{role}data")
    return buffers


def _last_offset(offsets: pa.Buffer, rows: int, name: str, role: str) -> int:
    """The count of children (bytes, items) that the offsets say; validate() checks the rest."""
    _expect(offsets, 4 * (rows + 1), name, role)
    view = np.frombuffer(offsets, dtype="<i4")
    if view[0] != 0:
        raise ColumnsRefused(name, f"its {role} must start at 0")
    last = int(view[-1])
    if last < 0:
        raise ColumnsRefused(name, f"its {role} end below 0")
    return last


def _check_expansion(entries: list[_Entry], arrays: dict[str, pa.Array], count: int,
                     frame_bytes: int) -> None:
    grown = sum(sum(e.lengths) for e in entries if e.rows == 1 and count > 1) * count
    if grown > MAX_EXPANSION * frame_bytes:
        raise ColumnsRefused(None, f"its constant columns would make {grown} bytes of a "
                             f"{frame_bytes}-byte frame (at most {MAX_EXPANSION} times)")


def _expand(array: pa.Array, count: int) -> pa.Array:
    if len(array) == count:
        return array
    if pa.types.is_map(array.type) or pa.types.is_list(array.type):
        return array.take(pa.array(np.zeros(count, dtype=np.int32)))
    return pa.repeat(array[0], count)  # 5x faster than take() for scalars


def _check_values(columns: dict[str, pa.Array]) -> None:
    kind = columns["kind"]
    if kind.null_count or pc.any(pc.equal(pc.binary_length(kind), 0)).as_py():
        raise ColumnsRefused("kind", "every event needs a kind that is not empty")
    time = columns["time"]
    if time.null_count < len(time) and pc.min(time).as_py() < EARLIEST_TIME_NS:
        raise ColumnsRefused("time", "a time before 1973: integer times are nanoseconds "
                                     "since 1970")
    duration = columns.get("duration_s")
    if duration is not None and not _finite(duration):
        raise ColumnsRefused("duration_s", "a value that is not finite")
    if duration is not None and duration.null_count < len(duration) \
            and pc.min(duration).as_py() < 0:
        raise ColumnsRefused("duration_s", "a negative value")
    metrics = columns.get("metrics")
    if metrics is not None and not _finite(metrics.items):
        raise ColumnsRefused("metrics", "a value that is not finite (send its name in "
                             "nonfinite)")


def _finite(numbers: pa.Array) -> bool:
    if not numbers.null_count:
        return bool(np.isfinite(numbers.to_numpy()).all())
    return pc.all(pc.is_finite(numbers)).as_py() is not False  # nulls are skipped


def _sorted_map(column: pa.Array | None, name: str, count: int) -> pa.Array:
    """Entries sorted by key, as the NDJSON path stores them; a key twice in a row refused.

    The emitter sends them sorted when it can; then one comparison pass shows it.
    """
    if column is None:
        return pa.nulls(count, _ARROW[name])
    if not _out_of_order(column, pc.greater):
        return column
    column = sort_map_entries(column)
    if _out_of_order(column, pc.not_equal):
        raise ColumnsRefused(name, "a key twice in one event")
    return column


def _out_of_order(column: pa.Array, in_order: Callable[..., pa.Array]) -> bool:
    """Whether some key is not `in_order` against the key before it in the same row."""
    keys = column.keys
    if len(keys) < 2:
        return False
    offsets = column.offsets.to_numpy()
    rows = np.repeat(np.arange(len(column)), np.diff(offsets))
    same_row = rows[1:] == rows[:-1]
    ordered = in_order(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(
        zero_copy_only=False)
    return bool((same_row & ~ordered).any())
