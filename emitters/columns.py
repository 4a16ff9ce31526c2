"""COLUMNS frame bodies: a frame's events as Arrow-layout column buffers (standard library).

The layout is docs/wire-protocol.md, "COLUMNS"; the agent's reader is
aggregator/decode/columns.py. The rows come from `events.build_events` with the
context's base left out, so every value went through `emitters.values` exactly as on the
NDJSON path; the base columns (source, job_id, run_id, node_id) are then filled in per
column, and a column whose value is the same in every row is sent once.

Whatever this layout cannot promise to store exactly as the agent would store its NDJSON
(a `time` given as text, an event the agent would reject, a field outside EVENT_FIELDS
from a built row) raises NotColumnar, and the caller sends those rows as NDJSON.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from itertools import accumulate, chain, repeat
from operator import is_not, itemgetter
from typing import Any, Final

from emitters.fields import AGENT_STAMPED, EARLIEST_TIME_NS, EVENT_FIELDS

# Buffers of each column type, in frame order (docs/wire-protocol.md, "COLUMNS").
BUFFERS: Final[dict[str, tuple[str, ...]]] = {
    "string": ("validity", "offsets", "data"),
    "int32": ("validity", "values"),
    "int64": ("validity", "values"),
    "float64": ("validity", "values"),
    "timestamp_ns": ("validity", "values"),
    "list_string": ("validity", "offsets", "item_offsets", "item_data"),
    "map_string_float64": ("validity", "offsets", "key_offsets", "key_data", "values"),
    "map_string_string": ("validity", "offsets", "key_offsets", "key_data",
                          "value_offsets", "value_data"),
}
# Constant columns are sent once and repeated for every event by the agent: all of them
# together may grow a frame by at most this factor (the agent refuses more).
MAX_EXPANSION: Final = 16
ALIGN: Final = 8  # buffers start at multiples of 8 from the frame body's first byte
HEADER: Final = 30  # version, type, session, seq, count: body bytes before the columns
COLUMN_COUNT: Final = struct.Struct(">H")
ROWS: Final = struct.Struct(">I")
LENGTH: Final = struct.Struct(">I")
_FIXED: Final = {"int32": "i", "int64": "q", "float64": "d", "timestamp_ns": "q"}
_BIG_ENDIAN: Final = sys.byteorder == "big"
_COLUMNS: Final = {name: kind for name, kind in EVENT_FIELDS.items() if name not in AGENT_STAMPED}
_NONE: Final = type(None)

assert array("i").itemsize == 4 and array("q").itemsize == 8 and array("d").itemsize == 8


class NotColumnar(Exception):
    """These rows must go as NDJSON: the message says why (for tests, never for users)."""


def encode_rows(rows: Sequence[dict[str, Any]], base: Mapping[str, Any],
                trusted: bool = True) -> bytes:
    """The column table and buffers of a COLUMNS frame (what follows its 30-byte header).

    `trusted`: every row came from emit() or op() through `emitters.values`, so its values
    have their columns' Python types already; rows built elsewhere are checked.
    """
    if not rows:
        raise NotColumnar("no rows")
    columns, uniform = _transpose(rows)
    return encode_columns(columns, len(rows), base, trusted, uniform)


def encode_columns(columns: dict[str, list[Any]], n: int, base: Mapping[str, Any],
                   trusted: bool = True, uniform: bool = False) -> bytes:
    """The same from a list of values per column (None: absent); `uniform`: no None."""
    payload, grown = _encode_columns(dict(columns), n, base, trusted, uniform, True)
    if grown > MAX_EXPANSION * len(payload):  # long constants: sent in full instead
        payload, _ = _encode_columns(dict(columns), n, base, trusted, uniform, False)
    return payload


def _encode_columns(columns: dict[str, list[Any]], n: int, base: Mapping[str, Any],
                    trusted: bool, uniform: bool, constants: bool) -> tuple[bytes, int]:
    for key, value in base.items():
        column = columns.get(key)
        if column is None:
            columns[key] = [value] * n
        elif None in column:
            columns[key] = [value if v is None else v for v in column]
    if "time" not in columns or "kind" not in columns:
        raise NotColumnar("time or kind missing")
    table: list[bytes] = []
    buffers: list[bytes] = []
    grown = 0  # bytes the agent makes of the constant columns
    for name, values in columns.items():
        kind = _COLUMNS.get(name)
        if kind is None:
            raise NotColumnar(f"{name} is not a column a producer writes")
        # rows of the same fields from emit() and op() hold no None (values.py skips them)
        nones = 0 if uniform and trusted else values.count(None)
        if nones == n:
            continue  # absent from every row
        constant = constants and not nones and name != "time" and n > 1 and (
            values[0] == values[-1] and values.count(values[0]) == n)
        if constant:
            values = values[:1]  # the same in every row: sent once
        parts = _encode(name, kind, values, nones, trusted)
        if constant:
            grown += sum(map(len, parts)) * n
        table.append(_column_entry(name, kind, len(values), parts))
        buffers += parts
    head = COLUMN_COUNT.pack(len(table)) + b"".join(table)
    out = [head, bytes(-(HEADER + len(head)) % ALIGN)]
    for part in buffers:
        out.append(part)
        out.append(bytes(-len(part) % ALIGN))
    return b"".join(out), grown


def _transpose(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, list[Any]], bool]:
    """Rows of dicts to a list per key (None where a row lacks the key); whether every row
    had the same keys."""
    first = tuple(rows[0])
    keys = list(map(tuple, rows))
    if keys.count(first) == len(rows):  # every row has the same fields: zip in C
        if len(first) == 1:
            return {first[0]: [row[first[0]] for row in rows]}, True
        return dict(zip(first, map(list, zip(*map(itemgetter(*first), rows), strict=True)),
                        strict=True)), True
    names = dict.fromkeys(chain.from_iterable(keys))  # every key, in first-seen order
    return {name: list(map(dict.get, rows, repeat(name))) for name in names}, False


def _column_entry(name: str, kind: str, rows: int, parts: list[bytes]) -> bytes:
    raw_name, raw_kind = name.encode(), kind.encode()
    return b"".join([bytes((len(raw_name),)), raw_name, bytes((len(raw_kind),)), raw_kind,
                     ROWS.pack(rows), bytes((len(parts),)),
                     *(LENGTH.pack(len(part)) for part in parts)])


def _encode(name: str, kind: str, values: list[Any], nones: int, trusted: bool) -> list[bytes]:
    if kind in _CONTAINERS and _EMPTY[kind] in values:
        raise NotColumnar(f"{name}: an empty {kind}")  # the agent stores that row as null
    validity = b""
    if nones:
        validity = _validity(values)
        values = [_EMPTY[kind] if v is None else v for v in values]
    if not trusted or name == "time":  # time may be RFC 3339 text, which the agent parses
        _require_types(name, values, _PYTHON[kind])
    if kind in _FIXED:
        return [validity, _fixed(name, kind, values)]
    if kind == "string":
        if name == "kind" and "" in values:
            raise NotColumnar("an empty kind: the agent rejects that event")
        return [validity, *_strings(values)]
    if kind == "list_string":
        items = list(chain.from_iterable(values))
        if not trusted:
            _require_types(name, items, str)
        return [validity, _offsets(map(len, values), 0), *_strings(items)]
    return [validity, *_map(name, kind, values, trusted)]


_PYTHON: Final[dict[str, type]] = {
    "string": str, "int32": int, "int64": int, "float64": float, "timestamp_ns": int,
    "list_string": list, "map_string_float64": dict, "map_string_string": dict}


_EMPTY: Final[dict[str, Any]] = {
    "string": "", "int32": 0, "int64": 0, "float64": 0.0, "timestamp_ns": 0,
    "list_string": [], "map_string_float64": {}, "map_string_string": {}}


_CONTAINERS: Final = frozenset({"list_string", "map_string_float64", "map_string_string"})


def _validity(values: list[Any]) -> bytes:
    """Arrow's validity bitmap: bit i (least significant first) set when row i has a value.

    In C: a byte per row ("0"/"1"), reversed so that row 0 is the lowest bit of one int.
    """
    flags = bytes(map(is_not, values, repeat(None))).translate(_ASCII_BITS)[::-1]
    return int(flags, 2).to_bytes((len(values) + 7) // 8, "little")


_ASCII_BITS: Final = bytes.maketrans(b"\x00\x01", b"01")


def _require_types(name: str, values: list[Any], kind: type) -> None:
    if set(map(type, values)) - {kind}:
        raise NotColumnar(f"{name}: a value that is not {kind.__name__}")


def _fixed(name: str, kind: str, values: list[Any]) -> bytes:
    try:
        packed = array(_FIXED[kind], values)
    except (OverflowError, TypeError):
        raise NotColumnar(f"{name}: out of range or not a number") from None
    if kind == "float64" and not all(map(math.isfinite, packed)):
        raise NotColumnar(f"{name}: not finite")  # the agent rejects such an event
    if kind == "timestamp_ns" and min(packed) < EARLIEST_TIME_NS:
        raise NotColumnar(f"{name}: before 1973")  # another unit's: the agent says which
    if name == "duration_s" and min(packed) < 0:
        raise NotColumnar(f"{name}: negative")  # the agent refuses such an event
    return _little_endian(packed)


def _little_endian(packed: array[Any]) -> bytes:
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _offsets(lengths: Any, start: int) -> bytes:
    # through a list: array() takes a list several times faster than an iterator
    return _little_endian(array("i", list(accumulate(lengths, initial=start))))


def _strings(values: list[str]) -> tuple[bytes, bytes]:
    """32-bit offsets and UTF-8 data. A string that is not valid UTF-8 (a lone surrogate)
    is written as the NDJSON path writes it: with backslash escapes (values.scrub)."""
    joined = "".join(values)
    if joined.isascii():
        return _offsets(map(len, values), 0), joined.encode()
    try:
        encoded = [v.encode() for v in values]
    except UnicodeEncodeError:
        encoded = [v.encode("utf-8", "backslashreplace") for v in values]
    return _offsets(map(len, encoded), 0), b"".join(encoded)


def _map(name: str, kind: str, values: list[Any], trusted: bool) -> list[bytes]:
    """Offsets, keys and values. When every row has the same keys (metrics in a loop),
    each row's entries go sorted by key, which spares the agent its sort."""
    names = tuple(values[0])
    if len(names) > 1 and list(map(tuple, values)).count(names) == len(values):
        ordered = sorted(names)
        keys = ordered * len(values)
        items = list(chain.from_iterable(map(itemgetter(*ordered), values)))
    else:
        keys = list(chain.from_iterable(values))
        items = list(chain.from_iterable(map(dict.values, values)))
    if not trusted:
        _require_types(name, keys, str)
        _require_types(name, items, float if kind == "map_string_float64" else str)
    parts = [_offsets(map(len, values), 0), *_strings(keys)]
    if kind == "map_string_float64":
        parts.append(_fixed(name, "float64", items))
    else:
        parts += _strings(items)
    return parts

