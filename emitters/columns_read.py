"""A COLUMNS frame body back into event dicts, with the standard library only.

The emitter needs it when an agent refuses COLUMNS: the frames it holds unacked are
re-sent as NDJSON (Outbox.frames_as_ndjson). Tests read frames with it too. It trusts its
input (our own frames); the agent's reader (aggregator/decode/columns.py) trusts nothing.
"""

from __future__ import annotations

import sys
from array import array
from itertools import pairwise
from typing import Any

from emitters.columns import ALIGN, BUFFERS, COLUMN_COUNT, HEADER, LENGTH, ROWS

_FIXED = {"int32": "i", "int64": "q", "float64": "d", "timestamp_ns": "q"}


def read_rows(payload: bytes, count: int) -> list[dict[str, Any]]:
    """The events of a COLUMNS frame (`payload`: the bytes after its 30-byte header)."""
    rows: list[dict[str, Any]] = [{} for _ in range(count)]
    for name, values in read_columns(payload).items():
        if len(values) == 1 and count != 1:
            values = values * count  # a constant column
        for row, value in zip(rows, values, strict=True):
            if value is not None:
                row[name] = value
    return rows


def read_columns(payload: bytes) -> dict[str, list[Any]]:
    (ncols,) = COLUMN_COUNT.unpack_from(payload)
    at = COLUMN_COUNT.size
    table: list[tuple[str, str, int, list[int]]] = []
    for _ in range(ncols):
        name, at = _short_text(payload, at)
        kind, at = _short_text(payload, at)
        (rows,) = ROWS.unpack_from(payload, at)
        nbuf = payload[at + ROWS.size]
        at += ROWS.size + 1
        lengths = [LENGTH.unpack_from(payload, at + LENGTH.size * i)[0] for i in range(nbuf)]
        at += LENGTH.size * nbuf
        table.append((name, kind, rows, lengths))
    at += -(HEADER + at) % ALIGN
    out: dict[str, list[Any]] = {}
    for name, kind, rows, lengths in table:
        parts = []
        for length in lengths:
            parts.append(payload[at : at + length])
            at += length + (-length % ALIGN)
        assert len(parts) == len(BUFFERS[kind])
        out[name] = _values(kind, rows, parts)
    return out


def _short_text(payload: bytes, at: int) -> tuple[str, int]:
    length = payload[at]
    return payload[at + 1 : at + 1 + length].decode(), at + 1 + length


def _values(kind: str, rows: int, parts: list[bytes]) -> list[Any]:
    valid = _valid(parts[0], rows)
    if kind in _FIXED:
        values: list[Any] = list(_array(_FIXED[kind], parts[1]))
    elif kind == "string":
        values = _strings(parts[1], parts[2])
    elif kind == "list_string":
        items = _strings(parts[2], parts[3])
        values = [items[a:b] for a, b in _spans(parts[1])]
    else:
        keys = _strings(parts[2], parts[3])
        items = (list(_array("d", parts[4])) if kind == "map_string_float64"
                 else _strings(parts[4], parts[5]))
        values = [dict(zip(keys[a:b], items[a:b], strict=True)) for a, b in _spans(parts[1])]
    return [v if ok else None for v, ok in zip(values, valid, strict=True)]


def _valid(bitmap: bytes, rows: int) -> list[bool]:
    if not bitmap:
        return [True] * rows
    return [bool(bitmap[i >> 3] >> (i & 7) & 1) for i in range(rows)]


def _array(code: str, raw: bytes) -> array[Any]:
    out = array(code, raw)
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _spans(raw: bytes) -> list[tuple[int, int]]:
    offsets = _array("i", raw)
    return list(pairwise(offsets))


def _strings(offsets: bytes, data: bytes) -> list[str]:
    return [data[a:b].decode() for a, b in _spans(offsets)]
