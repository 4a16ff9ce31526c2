"""Arrow arrays -> JSON value text, a whole column at a time.

Each function turns one Arrow array into a string array of JSON text (or inspects the
raw buffers) with numpy and Arrow kernels, never one Python object per value.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

Bytes = npt.NDArray[np.uint8]
_NS: Final = 1_000_000_000
_NUMPY: Final = orjson.OPT_SERIALIZE_NUMPY
_ESCAPES: Final = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
_SECONDS_TABLE: Final = 1 << 16  # distinct seconds up to this span: a direct table


def escape_strings(text: Any) -> Any:
    """JSON string escaping, only for arrays that hold a quote, backslash or control."""
    data = bytes_of(text, offsets_of(text))
    if not data.size or not (data.min() < 32 or (data == 34).any() or (data == 92).any()):
        return text
    for raw, escaped in _ESCAPES:
        text = pc.replace_substring(text, raw, escaped)
    if (data := bytes_of(text, offsets_of(text))).size and data.min() < 32:
        for code in range(32):
            text = pc.replace_substring(text, chr(code), f"\\u{code:04x}")
    return text


def float_text(column: Any) -> Any:
    """Shortest round-trip text of each float; NaN, infinities and nulls become `null`."""
    values = numbers_of(pc.fill_null(column, np.nan) if column.null_count else column)
    values = values.astype(np.float64, copy=False)
    raw = orjson.dumps(values, option=_NUMPY)[1:-1]
    commas = np.flatnonzero(np.frombuffer(raw, np.uint8) == 44)
    offsets = np.empty(len(values) + 1, np.int32)
    offsets[0] = 0
    offsets[1:-1] = commas - np.arange(len(commas))
    offsets[-1] = len(raw) - len(commas)
    return strings_from(offsets, raw.replace(b",", b""), len(values))


def time_text(column: Any) -> Any:
    """RFC 3339 UTC with nine fractional digits, e.g. 2026-01-02T03:04:05.123456789Z."""
    nanos = numbers_of(pc.fill_null(column, 0) if column.null_count else column).view(np.int64)
    seconds, fraction = np.divmod(nanos, _NS)
    low = int(seconds.min())
    index = seconds - low
    if int(index.max()) < _SECONDS_TABLE:  # usual: a batch spans seconds to minutes
        used = slots = np.flatnonzero(np.bincount(index))  # table row = second - low
        table = np.zeros((int(index.max()) + 1, 20), np.uint8)
    else:
        used, index = np.unique(index, return_inverse=True)
        slots = np.arange(len(used))
        table = np.zeros((len(used), 20), np.uint8)
    try:
        heads = "".join(dt.datetime.fromtimestamp(low + int(s), dt.UTC)
                        .strftime("%Y-%m-%dT%H:%M:%S.") for s in used).encode()
    except (OverflowError, ValueError, OSError):
        heads = b""
    if len(heads) != 20 * len(used):  # years outside 1000-9999
        return pc.strftime(column, format="%Y-%m-%dT%H:%M:%SZ")
    table[slots] = np.frombuffer(heads, np.uint8).reshape(-1, 20)
    rows = np.empty((len(nanos), 30), np.uint8)
    rows[:, :20] = table[index]
    digits = fraction.astype(np.uint32)
    for at in range(28, 19, -1):  # scalar division by 10 is vectorized; lookups are not
        quotient = digits // 10
        rows[:, at] = digits - quotient * 10 + 48
        digits = quotient
    rows[:, 29] = ord("Z")
    return strings_from_rows(rows)


def same_rows(rows: Bytes) -> bool:
    """Every row equals the first: a constant column (memcmp, not an elementwise compare)."""
    first: bytes = rows[0].tobytes()
    return bool(rows[-1].tobytes() == first and first * len(rows) == rows.tobytes())


def masked(text: Any, column: Any) -> Any:
    """`text` with nulls where `column` has them."""
    return pc.if_else(column.is_valid(), text, None) if column.null_count else text


def strings_from_rows(rows: Bytes) -> Any:
    """A string array over (n, w) fixed-width rows, without a copy."""
    n, width = rows.shape
    return strings_from(np.arange(0, n * width + 1, width, dtype=np.int32), rows, n)


def strings_from(offsets: npt.NDArray[np.int32], data: Any, n: int) -> Any:
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def numbers_of(array: Any) -> npt.NDArray[Any]:
    """The values of a numeric or timestamp array without nulls, without a copy."""
    width = array.type.bit_width // 8
    dtype = np.dtype(f"<f{width}" if pa.types.is_floating(array.type) else f"<i{width}")
    if pa.types.is_unsigned_integer(array.type):
        dtype = np.dtype(f"<u{width}")
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * width)


def offsets_of(array: Any) -> npt.NDArray[np.int32]:
    """The value offsets of a string, list or map array (its slice of them)."""
    return np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)


def bytes_of(text: Any, offsets: npt.NDArray[np.int32]) -> Bytes:
    """The character bytes of a string array between its first and last offset."""
    buffer = text.buffers()[2]
    if buffer is None or len(offsets) < 2:
        return np.empty(0, np.uint8)
    return np.frombuffer(buffer, np.uint8)[int(offsets[0]) : int(offsets[-1])]
