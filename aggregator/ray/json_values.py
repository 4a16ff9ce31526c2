"""The values of the events the columnar path takes, converted whole columns at a time:
base64 ids to hex (all at once with numpy where a column's ids share one length, as
Ray's do; else id by id, with binascii the judge as on the fast path), Ray's time texts
to UTC nanoseconds (one Arrow cast, as `columns.py` converts the fast path's), JSON
integers to int32. Each says which values converted; the others' events go to the
Python path.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggregator.ray.json_checks import INT, Leaf, mask, matching, valid_of
from aggregator.ray.values import RayValueError, b64_hex

_UTC_NS: Final = pa.timestamp("ns", tz="UTC")


def hex_ids(values: pa.Array, cache: bool = True) -> tuple[pa.Array, np.ndarray]:
    """Quoted base64 ids (already matched) -> hex, null for absent or empty; and which
    converted. Ids of one length (Ray's are) are decoded all at once; any other column
    id by id, with binascii the judge as on the fast path."""
    inner = pc.utf8_slice_codeunits(values, 1, -1)
    inner = pc.if_else(pc.equal(inner, ""), _NO_TEXT, inner)
    set_ = inner.is_valid()
    found = _decode_at_once(inner.filter(set_))
    if found is not None:
        at = np.full(len(inner), len(found))
        at[mask(set_)] = np.arange(len(found))
        full = pa.concat_arrays([found, pa.nulls(1, pa.string())]).take(pa.array(at))
        return full, np.ones(len(values), dtype=bool)
    return _decode_one_by_one(inner, cache)


_NO_TEXT: Final = pa.scalar(None, pa.string())
_SIXES: Final = np.full(256, 255, dtype=np.uint8)
_SIXES[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                     dtype=np.uint8)] = np.arange(64, dtype=np.uint8)
_SIXES[ord("=")] = 0
_HEX: Final = np.frombuffer(b"".join(b"%02x" % i for i in range(256)),
                            dtype=np.uint8).reshape(256, 2)


def _decode_at_once(ids: pa.Array) -> pa.Array | None:
    """base64 ids of one length and padding -> hex; None for any other column."""
    if not len(ids):
        return pa.array([], pa.string())
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32)[ids.offset:ids.offset + len(ids) + 1]
    width = int(offsets[1] - offsets[0])
    if width % 4 or np.any(np.diff(offsets) != width):
        return None
    chars = np.frombuffer(ids.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    chars = chars.reshape(len(ids), width)
    pad = int(chars[0, -1] == ord("=")) + int(chars[0, -2] == ord("="))
    if np.any((chars[:, -1] == ord("=")) != (pad >= 1)) or \
            np.any((chars[:, -2] == ord("=")) != (pad == 2)):
        return None
    sixes = _SIXES[chars].reshape(len(ids), width // 4, 4).astype(np.uint32)
    words = (sixes[..., 0] << 18) | (sixes[..., 1] << 12) | (sixes[..., 2] << 6) | sixes[..., 3]
    raw = np.stack([words >> 16, words >> 8, words], axis=-1).astype(np.uint8)
    raw = raw.reshape(len(ids), -1)[:, :raw.shape[1] * 3 - pad] if pad else \
        raw.reshape(len(ids), -1)
    text = _HEX[raw].reshape(len(ids), -1)
    size = text.shape[1]
    hex_offsets = np.arange(0, (len(ids) + 1) * size, size, dtype=np.int32)
    return pa.StringArray.from_buffers(len(ids), pa.py_buffer(hex_offsets),
                                       pa.py_buffer(np.ascontiguousarray(text)))


def _decode_one_by_one(inner: pa.Array, cache: bool) -> tuple[pa.Array, np.ndarray]:
    distinct = pc.unique(inner)
    hexes: list[str | None] = []
    bad: list[Any] = []
    for value in distinct.to_pylist():
        try:
            hexes.append(b64_hex(value, "id", cache) if value is not None else None)
        except RayValueError:
            hexes.append(None)
            bad.append(value)
    found = pa.array(hexes, pa.string()).take(pc.index_in(inner, distinct))
    failed = mask(pc.is_in(inner, pa.array(bad, pa.string()))) if bad \
        else np.zeros(len(inner), dtype=bool)
    return found, ~failed


def times_ns(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Quoted time texts (already matched) -> UTC ns; and which converted. One cast for
    all, as `columns.py` does; a text naming no real day (Feb 30) declines its event."""
    texts = pc.utf8_slice_codeunits(values, 1, -1)
    try:
        return texts.cast(_UTC_NS), np.ones(len(values), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        parsed = [_one_time(t) for t in texts.to_pylist()]
        ok = np.array([t is not None for t in parsed], dtype=bool) | mask(texts.is_null())
        return pa.array(parsed, pa.int64()).cast(_UTC_NS), ok


def _one_time(text: str | None) -> int | None:
    try:
        return None if text is None else int(pa.scalar(text).cast(_UTC_NS).value)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def int32s(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """JSON integers (absent: 0) -> int32; and which are integers in range."""
    ok = matching([Leaf(values)], INT)[0] | ~valid_of(values)
    numbers = pc.if_else(pa.array(ok), values, pa.scalar(None, pa.string()))
    wide = numbers.cast(pa.int64()).fill_null(0)
    in_range = mask(pc.and_(pc.greater_equal(wide, -2**31), pc.less(wide, 2**31)))
    return wide.cast(pa.int32(), safe=False), ok & in_range
