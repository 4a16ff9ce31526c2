"""Arrow event rows -> JSON objects, one per row, encoded column by column.

Building one Python dict per event costs 2-4 us; this encoder never does. Each column
becomes Arrow string text (escaped only where needed, numbers through orjson's numpy
path, times as RFC 3339 from a table of distinct seconds; a column with one value in
every row becomes a literal). Columns whose texts differ in length by at most
PAD_LIMIT bytes are padded with spaces after the value (insignificant JSON whitespace)
to one width, and numpy lays them side by side at memcpy speed; a narrow column with
nulls writes them as `null`. Ragged columns with nulls are appended by Arrow's
element-wise join, which skips the absent values' keys.

Every row ends with b"\n". A raw newline cannot occur inside a row (strings escape
it), so a JSON array body is the rows with those newlines turned into commas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sinks.http.json_values import (
    Bytes,
    bytes_of,
    escape_strings,
    float_text,
    masked,
    numbers_of,
    offsets_of,
    same_rows,
    strings_from_rows,
    time_text,
)

PAD_LIMIT: Final = 24  # bytes of padding a value may get to join the fixed-width part
CHUNK_ROWS: Final = 16384  # rows encoded at once: amortizes per-column calls (measured)



@dataclass(frozen=True, slots=True)
class EncodedRows:
    """JSON objects back to back, each ending in b"\\n"; `ends[i]` is the byte end of row i."""

    data: memoryview
    ends: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.ends)

    def start(self, row: int) -> int:
        return 0 if row == 0 else int(self.ends[row - 1])

    def rows(self, first: int, stop: int) -> memoryview:
        return self.data[self.start(first) : self.start(stop)]


@dataclass(frozen=True, slots=True)
class _Piece:
    """key + open + value text + close. `text` is null where the value is absent, or None
    when every row has the same value, which is then part of `open`."""

    key: str
    open: str
    text: Any  # pa.StringArray | None
    close: str

    def or_null(self) -> _Piece:
        """The same values with absent ones written as `null` (so the key is never dropped)."""
        quoted = pc.binary_join_element_wise(self.open, self.text, self.close, "")
        return _Piece(self.key, "", pc.coalesce(quoted, pa.scalar("null")), "")


def encode_rows(table: pa.Table | pa.RecordBatch) -> list[EncodedRows]:
    """The rows of `table` as JSON objects, in chunks of at most CHUNK_ROWS rows."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    return [_encode_chunk(b) for b in table.combine_chunks().to_batches(CHUNK_ROWS) if b.num_rows]


def _encode_chunk(batch: pa.RecordBatch) -> EncodedRows:
    n = batch.num_rows
    fixed: list[bytes | Bytes] = []
    loose: list[Any] = []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if column.null_count == n:
            continue
        laid = _laid_column(name, column, n, first=not fixed)
        if isinstance(laid, list):
            fixed.extend(laid)
        else:
            loose.append(laid)
    if not fixed:
        fixed.append(b"{")
    if not loose:
        fixed.append(b"}\n")
        block = _lay_out(fixed, n)
        data = memoryview(block.data).cast("B")
        return EncodedRows(data, np.arange(1, n + 1, dtype=np.int64) * block.shape[1])
    rows = pc.binary_join_element_wise(strings_from_rows(_lay_out(fixed, n)), *loose, "}\n", "",
                                       null_handling="skip")
    if fixed == [b"{"]:
        rows = pc.replace_substring(rows, "{,", "{", max_replacements=1)
    offsets = offsets_of(rows)
    data = memoryview(rows.buffers()[2]).cast("B")[int(offsets[0]) : int(offsets[-1])]
    return EncodedRows(data, (offsets[1:] - offsets[0]).astype(np.int64))


def _laid_column(name: str, column: Any, n: int, first: bool) -> list[bytes | Bytes] | Any:
    """Fixed-width parts of one column, or its fragments (",key:value", null when absent)."""
    pieces = _column_pieces(name, column, split_maps=True)
    laid = [_fixed_width(p, n) for p in pieces]
    if len(pieces) == 1 and laid[0] is None and pieces[0].text.null_count:
        pieces = [pieces[0].or_null()]
        laid = [_fixed_width(pieces[0], n)]
    if any(parts is None for parts in laid):
        whole = _column_pieces(name, column, split_maps=False)[0] if len(pieces) > 1 else pieces[0]
        return pc.binary_join_element_wise("," + whole.key + whole.open, whole.text, whole.close,
                                           "")
    out: list[bytes | Bytes] = []
    for index, (piece, parts) in enumerate(zip(pieces, laid, strict=True)):
        separator = "" if index else ("{" if first else ",")
        out.append((separator + piece.key + piece.open).encode())
        out.extend(parts or ())
    return out


def _lay_out(parts: list[bytes | Bytes], n: int) -> Bytes:
    """Parts side by side in each of n rows: literal bytes repeat, (n, w) arrays go in order."""
    merged: list[bytes | Bytes] = []
    for part in parts:
        if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] += part
        else:
            merged.append(part)
    widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in merged]
    merged = [p for p, w in zip(merged, widths, strict=True) if w]
    widths = [w for w in widths if w]
    row_type = np.dtype([(f"f{i}", f"V{w}") for i, w in enumerate(widths)])
    pairs = zip(merged, widths, strict=True)
    template = b"".join(p if isinstance(p, bytes) else bytes(w) for p, w in pairs)
    # Tiling one template row is a plain copy; assigning a literal field per row is not.
    rows = np.tile(np.frombuffer(template, row_type), n)
    for i, (part, width) in enumerate(zip(merged, widths, strict=True)):
        if not isinstance(part, bytes):
            rows[f"f{i}"] = np.ascontiguousarray(part).view(f"V{width}").ravel()
    return rows.view(np.uint8).reshape(n, sum(widths))


def _fixed_width(piece: _Piece, n: int) -> list[bytes | Bytes] | None:
    """Parts of (n, w) rows of text + close, spaces after close; None: nulls or too ragged."""
    text = piece.text
    if text is None:
        return [piece.close.encode()]
    if text.null_count:
        return None
    offsets = offsets_of(text)
    lengths = np.diff(offsets)
    low, high = int(lengths.min()), int(lengths.max())
    if high - low > PAD_LIMIT:
        return None
    if low != high:
        text = pc.ascii_rpad(text, high, " ")
        offsets = offsets_of(text)
        if offsets[-1] - offsets[0] != n * high:
            return None
    body = bytes_of(text, offsets).reshape(n, high)
    if low == high and same_rows(body):
        return [body[0].tobytes() + piece.close.encode()]  # one value in every row
    if low == high or not piece.close:
        return [body, piece.close.encode()]
    out = np.empty((n, high + len(piece.close)), np.uint8)
    out[:, :high] = body
    out[:, high:] = 32
    for j, char in enumerate(piece.close.encode()):  # right after each value, then spaces
        out[np.arange(n), lengths + j] = char
    return [out]


def _column_pieces(name: str, column: Any, *, split_maps: bool) -> list[_Piece]:
    key = orjson.dumps(name).decode() + ":"
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = column if kind == pa.string() else column.cast(pa.string())
        return [_constant_or(_Piece(key, '"', text, '"'), escape=True)]
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return [_number_piece(key, "", column)]
    if pa.types.is_timestamp(kind):
        return [_Piece(key, '"', masked(time_text(column), column), '"')]
    if pa.types.is_map(kind):
        split = _same_keys_pieces(key, column) if split_maps else None
        return split or [_Piece(key, "{", _map_text(column), "}")]
    if pa.types.is_list(kind):
        items = _quoted_or_null(_list_values(column))
        return [_Piece(key, "[", _joined_lists(column, items), "]")]
    raise TypeError(f"column {name!r} has a type the JSON encoder does not know: {kind}")


def _number_piece(key: str, open_: str, column: Any) -> _Piece:
    """Integers or floats; one value in every row becomes a literal, found before formatting."""
    numbers = numbers_of(column)
    if not column.null_count and len(numbers) and numbers[-1] == numbers[0] and (
            numbers == numbers[0]).all():
        return _Piece(key, open_ + orjson.dumps(numbers[0].item()).decode(), None, "")
    if pa.types.is_floating(column.type):
        return _Piece(key, open_, masked(float_text(column), column), "")
    return _Piece(key, open_, pc.cast(column, pa.string()), "")


def _constant_or(piece: _Piece, *, escape: bool) -> _Piece:
    """A literal piece when every row holds the same string, else the piece (escaped)."""
    text = piece.text
    offsets = offsets_of(text)
    lengths = np.diff(offsets)
    if not text.null_count and len(lengths) and (lengths == lengths[0]).all():
        rows = bytes_of(text, offsets).reshape(len(lengths), int(lengths[0]))
        if same_rows(rows):
            value = orjson.dumps(rows[0].tobytes().decode(errors="replace")).decode()
            return _Piece(piece.key, piece.open[:-1] + value, None, piece.close[1:])
    return _Piece(piece.key, piece.open, escape_strings(text) if escape else text, piece.close)


def _same_keys_pieces(key: str, column: Any) -> list[_Piece] | None:
    """A map whose rows all have the same keys in the same order: one piece per key."""
    n = len(column)
    offsets = offsets_of(column)
    width = int(offsets[1] - offsets[0]) if n else 0
    if column.null_count or width == 0 or not (np.diff(offsets) == width).all():
        return None
    keys, items = _list_values(column, "keys"), _list_values(column, "items")
    key_offsets = offsets_of(keys)
    key_bytes = bytes_of(keys, key_offsets)
    first = int(key_offsets[width] - key_offsets[0])
    if len(key_bytes) != n * first or not (key_bytes.reshape(n, first) == key_bytes[:first]).all():
        return None
    if not (np.diff(key_offsets).reshape(n, width) == np.diff(key_offsets[: width + 1])).all():
        return None
    names = [orjson.dumps(k).decode() for k in keys.slice(0, width).to_pylist()]
    quoted = pa.types.is_string(items.type)
    pieces = []
    for j, item_key in enumerate(names):
        if quoted:
            values = items.take(pa.array(np.arange(j, n * width, width)))
            piece = _constant_or(_Piece("", item_key + ':"', values, '"'), escape=True)
        elif items.null_count:
            piece = _number_piece("", item_key + ":", items.take(pa.array(np.arange(j, n * width,
                                                                                  width))))
        else:
            piece = _number_piece("", item_key + ":",
                                  pa.array(numbers_of(items).reshape(n, width)[:, j].copy()))
        open_ = ("" if j == 0 else ",") + piece.open
        close = piece.close + ("}" if j == width - 1 else "")
        pieces.append(_Piece(key + "{" if j == 0 else "", open_, piece.text, close))
    return pieces


def _map_text(column: Any) -> Any:
    keys, items = escape_strings(_list_values(column, "keys")), _list_values(column, "items")
    values = _quoted_or_null(items) if pa.types.is_string(items.type) else float_text(items)
    entries = pc.binary_join_element_wise('"', keys, '":', values, "")
    return _joined_lists(column, entries)


def _quoted_or_null(strings: Any) -> Any:
    quoted = pc.binary_join_element_wise('"', escape_strings(strings), '"', "")
    return pc.coalesce(quoted, pa.scalar("null")) if strings.null_count else quoted


def _joined_lists(column: Any, entries: Any) -> Any:
    offsets = offsets_of(column)
    lists = pa.ListArray.from_arrays(pa.array(offsets - offsets[0]), entries)
    return masked(pc.binary_join(lists, ","), column)


def _list_values(column: Any, part: str = "values") -> Any:
    offsets = offsets_of(column)
    return getattr(column, part).slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
