"""Frames from encoding to ack: COLUMNS or NDJSON payloads packed to a size, kept until acked.

The outbox numbers frames 1, 2, 3... in one session and keeps each until the agent acks
or nacks it; its bytes are bounded, and what does not fit is dropped and counted by
reason in `lost` (the sender turns those counts into `loss` events).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import orjson

from emitters import wire
from emitters.columns import encode_columns, encode_rows
from emitters.columns_items import emit_columns
from emitters.columns_read import read_rows
from emitters.events import BUILT_LENGTH, Context, build_events
from emitters.ids import new_session_id
from emitters.values import scrub, values_left_to_agent

BATCH_HEADER = 30  # version, type, session, seq, count: body bytes before the payload


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


class Outbox:
    def __init__(self, max_frame_bytes: int, max_buffer_bytes: int) -> None:
        self.session = new_session_id()
        self.frames: dict[int, tuple[bytes, int]] = {}  # seq -> (frame, events), in seq order
        self.bytes = 0
        self.max_buffer_bytes = max_buffer_bytes
        self.lost: Counter[str] = Counter()  # events dropped, by reason
        self._packer = FramePacker(max_frame_bytes - BATCH_HEADER, self.lost)
        self._columns = ColumnsPacker(max_frame_bytes - BATCH_HEADER, self.lost)
        self._next_seq = 1
        self.resize(max_frame_bytes, max_buffer_bytes)

    def resize(self, max_frame_bytes: int, max_buffer_bytes: int) -> None:
        # A frame larger than the whole buffer could never be kept.
        self._packer.max_bytes = min(max_frame_bytes, max_buffer_bytes) - BATCH_HEADER
        self._columns.max_bytes = self._packer.max_bytes
        self.max_buffer_bytes = max_buffer_bytes

    @property
    def full(self) -> bool:
        return self.bytes >= self.max_buffer_bytes

    @property
    def last_seq(self) -> int:
        """The seq of the newest frame made so far (0 before the first)."""
        return self._next_seq - 1

    def oldest(self) -> int | None:
        return next(iter(self.frames), None)

    def add_events(self, events: Sequence[dict[str, Any]]) -> Iterator[int]:
        """Pack events; yield the seq of each frame that filled up."""
        for payload, count in self._packer.add(events):
            seq = self.add_payload(payload, count)
            if seq is not None:
                yield seq

    def add_rows(self, rows: list[dict[str, Any]], base: Mapping[str, Any],
                 trusted: bool) -> Iterator[int]:
        """Pack rows (events without `base`) as COLUMNS; yield the seq of each frame made."""
        for made in self._columns.add(rows, base, trusted):
            yield from self._keep(made)

    def add_columns(self, columns: dict[str, list[Any]], n: int,
                    base: Mapping[str, Any]) -> Iterator[int]:
        """The same for n rows already in columns."""
        for made in self._columns.add_columns(columns, n, base):
            yield from self._keep(made)

    def add_items(self, items: list[tuple[Any, ...]], context: Context) -> list[int]:
        """Queued emit()/op()/built items as COLUMNS: plain emit() runs straight into
        columns, the rest through event rows; the seqs of the frames made. Raises what
        build_events raises."""
        try:
            columns = emit_columns(items, context)
        except Exception:  # a bug there costs the fast path, not the events
            columns = None
        if columns is not None:
            return list(self.add_columns(columns, len(items), context.base))
        left_before = values_left_to_agent()
        rows = build_events(items, Context({}, context.attrs), self.lost)
        # Built rows, and rows holding a value left for the agent to refuse, are encoded
        # with their types checked: such a row goes as NDJSON, where the agent says why.
        trusted = (BUILT_LENGTH not in map(len, items)
                   and values_left_to_agent() == left_before)
        return list(self.add_rows(rows, context.base, trusted))

    def close_frame(self) -> Iterator[int]:
        """Make frames of what is packed so far; the seq of each one kept."""
        for made in self._columns.close():
            yield from self._keep(made)
        closed = self._packer.close()
        if closed is not None and (seq := self.add_payload(*closed)) is not None:
            yield seq

    def _keep(self, made: tuple[bytes, int] | list[dict[str, Any]]) -> Iterator[int]:
        if isinstance(made, tuple):
            seq = self.add_payload(*made, frame_type=wire.COLUMNS)
            if seq is not None:
                yield seq
            return
        yield from self.add_events(made)  # rows the columns cannot carry go as NDJSON
        closed = self._packer.close()
        if closed is not None and (seq := self.add_payload(*closed)) is not None:
            yield seq

    def frames_as_ndjson(self) -> tuple[list[int], list[int]]:
        """Every unacked COLUMNS frame made again as NDJSON, for an agent that refuses
        COLUMNS (so it stored none of them): the seqs removed and the seqs made."""
        removed = [seq for seq, (frame, _) in self.frames.items() if frame[5] == wire.COLUMNS]
        made: list[int] = []
        for seq in removed:
            frame, count = self.frames.pop(seq)
            self.bytes -= len(frame)
            events = read_rows(frame[4 + BATCH_HEADER :], count)
            made += self.add_events(events)
            closed = self._packer.close()
            if closed is not None:
                made.append(self._store(*closed, wire.BATCH))
        return removed, made

    def add_payload(self, payload: bytes, count: int, force: bool = False,
                    frame_type: int = wire.BATCH) -> int | None:
        if not force and self.bytes + len(payload) + 4 + BATCH_HEADER > self.max_buffer_bytes:
            self.lost["buffer_full"] += count
            return None
        return self._store(payload, count, frame_type)

    def _store(self, payload: bytes, count: int, frame_type: int) -> int:
        encode = wire.encode_columns if frame_type == wire.COLUMNS else wire.encode_batch
        frame = encode(self.session, self._next_seq, count, payload)
        seq = self._next_seq
        self._next_seq += 1
        self.frames[seq] = (frame, count)
        self.bytes += len(frame)
        return seq

    def settle(self, seq: int) -> tuple[bytes, int] | None:
        """Forget an acked or nacked frame; None if it was settled already."""
        entry = self.frames.pop(seq, None)
        if entry is not None:
            self.bytes -= len(entry[0])
        return entry
