"""Events packed into frame payloads of a bounded size: NDJSON lines (`FramePacker`) or
COLUMNS tables (`ColumnsPacker`); what cannot be packed is dropped and counted by reason.
The outbox (emitters/outbox.py) turns each payload into a numbered frame and keeps it
until the agent answers."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from emitters.columns import encode_columns, encode_rows
from emitters.values import scrub


class FramePacker:
    """Packs encoded events into NDJSON payloads of at most `max_bytes`.

    A chunk of CHUNK events is encoded in one `orjson.dumps` call: every `dumps()` result
    holds about 4 KB however short its JSON, so a chunk encoded event by event held 1 MB
    where one call holds one buffer of the chunk's size (and packs 7% faster). The chunk
    is dumped as one array with a separator string between the events, which then becomes
    the newline: inside the JSON of an event a quote is always escaped, so
    `,"<separator>",` can only be one of ours, unless an event holds the random separator
    itself as a list item, which the line count shows (then the events are encoded one
    by one).
    """

    CHUNK = 256

    def __init__(self, max_bytes: int, dropped: Counter[str]) -> None:
        self.max_bytes = max_bytes
        self._dropped = dropped
        self._buf = bytearray()
        self._count = 0

    def add(self, events: Sequence[dict[str, Any]]) -> list[tuple[bytes, int]]:
        """Take events; return the payloads (with event counts) that filled up."""
        full: list[tuple[bytes, int]] = []
        for start in range(0, len(events), self.CHUNK):
            chunk = events[start : start + self.CHUNK]
            lines = _dumps_lines(chunk)
            if lines is None:
                encoded = self._encode_each(chunk)
            elif len(self._buf) + len(lines) + 1 <= self.max_bytes:
                self._buf += lines
                self._buf += b"\n"
                self._count += len(chunk)
                continue
            else:
                encoded = lines.split(b"\n")  # this frame fills up within the chunk
            for one in encoded:
                self._add_one(one, full)
        return full

    def close(self) -> tuple[bytes, int] | None:
        """The payload being filled, if it holds any event."""
        if not self._count:
            return None
        payload = (bytes(self._buf), self._count)
        self._buf = bytearray()
        self._count = 0
        return payload

    def _add_one(self, one: bytes, full: list[tuple[bytes, int]]) -> None:
        if len(one) + 1 > self.max_bytes:
            self._dropped["too_large"] += 1
            return
        if len(self._buf) + len(one) + 1 > self.max_bytes:
            closed = self.close()
            if closed is not None:
                full.append(closed)
        self._buf += one
        self._buf += b"\n"
        self._count += 1

    def _encode_each(self, chunk: Sequence[dict[str, Any]]) -> list[bytes]:
        """One by one, so that an event that cannot be encoded costs only itself."""
        out: list[bytes] = []
        for event in chunk:
            try:
                out.append(orjson.dumps(event))
                continue
            except Exception:
                pass
            try:
                out.append(orjson.dumps(scrub(event)))
            except Exception:
                self._dropped["unencodable"] += 1
        return out


_SEPARATOR: Final = os.urandom(16).hex()
_SEPARATOR_JSON: Final = b',"' + _SEPARATOR.encode() + b'",'


def _dumps_lines(chunk: Sequence[dict[str, Any]]) -> bytes | None:
    """The events as NDJSON lines (without the last newline), from one orjson call; None
    when some event cannot be encoded or held the separator."""
    items: list[Any] = [_SEPARATOR] * (2 * len(chunk) - 1)
    items[::2] = chunk
    try:
        lines = orjson.dumps(items)[1:-1].replace(_SEPARATOR_JSON, b"\n")
    except Exception:
        return None
    return lines if lines.count(b"\n") == len(chunk) - 1 else None


class ColumnsPacker:
    """Rows (events without the context's base) gathered into COLUMNS payloads.

    A frame's row count is guessed from the bytes per row of the frames before; a payload
    over `max_bytes` is split in halves. Rows the layout cannot carry come back, with
    their base, to go as NDJSON (emitters.columns.NotColumnar).
    """

    def __init__(self, max_bytes: int, dropped: Counter[str]) -> None:
        self.max_bytes = max_bytes
        self._dropped = dropped
        self._rows: list[dict[str, Any]] = []
        self._base: Mapping[str, Any] = {}
        self._trusted = True
        self._row_bytes = 128.0  # the last frames' bytes per row

    def add(self, rows: list[dict[str, Any]], base: Mapping[str, Any],
            trusted: bool) -> list[tuple[bytes, int] | list[dict[str, Any]]]:
        """Take rows; what filled up: (payload, rows) or a list of NDJSON events."""
        out: list[tuple[bytes, int] | list[dict[str, Any]]] = []
        if base is not self._base:
            out += self.close()
            self._base = base
        self._rows += rows
        self._trusted = self._trusted and trusted
        while len(self._rows) >= self._fit():
            out += self._encode(self._take(self._fit()))
        return out

    def add_columns(self, columns: dict[str, list[Any]], n: int, base: Mapping[str, Any]
                    ) -> list[tuple[bytes, int] | list[dict[str, Any]]]:
        """Rows already in columns (emitters.columns_items): framed now, after those
        gathered before them."""
        out = self.close()
        self._base = base
        start = 0
        while start < n:
            stop = min(n, start + self._fit())  # the guess improves frame by frame
            part = {name: values[start:stop] for name, values in columns.items()}
            out += self._encode_part(part, stop - start)
            start = stop
        return out

    def _encode_part(self, part: dict[str, list[Any]], n: int
                     ) -> list[tuple[bytes, int] | list[dict[str, Any]]]:
        try:
            payload = encode_columns(part, n, self._base)
        except Exception:  # NotColumnar, or a bug: the rows go as NDJSON
            return [self._as_events(part, n)]
        if len(payload) <= self.max_bytes:
            self._row_bytes = max(1.0, len(payload) / n)
            return [(payload, n)]
        if n == 1:
            self._dropped["too_large"] += 1
            return []
        half = n // 2
        return (self._encode_part({k: v[:half] for k, v in part.items()}, half)
                + self._encode_part({k: v[half:] for k, v in part.items()}, n - half))

    def _as_events(self, part: dict[str, list[Any]], n: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [dict(self._base) for _ in range(n)]
        for name, values in part.items():
            for row, value in zip(rows, values, strict=True):
                if value is not None:
                    row[name] = value
        return rows

    def close(self) -> list[tuple[bytes, int] | list[dict[str, Any]]]:
        out = self._encode(self._take(len(self._rows))) if self._rows else []
        self._trusted = True
        return out

    def _fit(self) -> int:
        return max(1, int(self.max_bytes * 0.9 / self._row_bytes))

    def _take(self, n: int) -> list[dict[str, Any]]:
        taken, self._rows = self._rows[:n], self._rows[n:]
        return taken

    def _encode(self, rows: list[dict[str, Any]]) -> list[tuple[bytes, int] | list[dict[str, Any]]]:
        try:
            payload = encode_rows(rows, self._base, self._trusted)
        except Exception:  # NotColumnar, or a bug: that costs the layout, not the events
            return [[{**self._base, **row} for row in rows]]
        if len(payload) <= self.max_bytes:
            self._row_bytes = max(1.0, len(payload) / len(rows))
            return [(payload, len(rows))]
        if len(rows) == 1:
            self._dropped["too_large"] += 1
            return []
        half = len(rows) // 2
        return self._encode(rows[:half]) + self._encode(rows[half:])
