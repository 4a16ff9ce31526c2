"""Event dicts -> Arrow batch, one event at a time, with a reason for every rejection.

This is the careful path: producers that are not our emitter (HTTP NDJSON, `evagg emit`,
Ray Event Export, OTLP) and socket frames the bulk decoder refused come through here.
Unknown fields go to `attrs` as strings; non-finite metrics become `nonfinite` names.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import pyarrow as pa

from emitters.fields import AGENT_STAMPED, EARLIEST_TIME_NS, EVENT_FIELDS
from emitters.ids import new_event_id
from sinks.schema import EVENT_SCHEMA


@dataclass(frozen=True, slots=True)
class Stamp:
    """What the agent knows about a batch, independent of what the producer says."""

    received_ns: int
    pid: int | None = None  # from SO_PEERCRED; None for HTTP producers
    uid: int | None = None
    node_id: str = ""
    host: str = ""

    @staticmethod
    def now(
        node_id: str = "", host: str = "", pid: int | None = None, uid: int | None = None
    ) -> Stamp:
        return Stamp(time.time_ns(), pid, uid, node_id, host)


@dataclass(slots=True)
class Normalized:
    batch: pa.RecordBatch
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)

    @property
    def accepted(self) -> int:
        return int(self.batch.num_rows)

    def first_reason(self) -> str:
        if not self.rejected:
            return ""
        index, reason = self.rejected[0]
        return f"event {index}: {reason}"


class EventError(ValueError):
    """One event that cannot be stored; the message says which field and why."""


_STRING_FIELDS = frozenset(n for n, t in EVENT_FIELDS.items() if t == "string")
_INT_FIELDS = frozenset(n for n, t in EVENT_FIELDS.items() if t in ("int32", "int64"))
_INT32_LIMIT = 2**31
_INT64_LIMIT = 2**63


def rows_to_batch(rows: Iterable[Any], stamp: Stamp) -> Normalized:
    columns: dict[str, list[Any]] = {name: [] for name in EVENT_FIELDS}
    rejected: list[tuple[int, str]] = []
    for index, row in enumerate(rows):
        try:
            event = normalize_event(row, stamp)
        except EventError as exc:
            rejected.append((index, str(exc)))
            continue
        for name, column in columns.items():
            column.append(event.get(name))
    batch = pa.RecordBatch.from_pydict(columns, schema=EVENT_SCHEMA)
    return Normalized(batch, rejected)


def ndjson_to_batch(payload: bytes, stamp: Stamp) -> Normalized:
    """Parse NDJSON (or one JSON array) line by line; bad lines are rejected, good ones kept."""
    stripped = payload.strip()
    if stripped.startswith(b"["):
        try:
            return rows_to_batch(orjson.loads(stripped), stamp)
        except orjson.JSONDecodeError as exc:
            if b"\n" not in stripped:  # one line, no array: nothing to keep
                return Normalized(_empty(), [(0, f"invalid JSON array: {exc}")])
        # not one array but lines, the first of them a list: each line on its own
    parsed: list[Any] = []
    bad: list[tuple[int, str]] = []
    for index, line in enumerate(l for l in stripped.split(b"\n") if l.strip()):
        try:
            parsed.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            bad.append((index, f"invalid JSON: {exc}"))
            parsed.append(_SKIP)
    result = rows_to_batch((p for p in parsed if p is not _SKIP), stamp)
    if bad:
        result.rejected = sorted(bad + _reindex(result.rejected, parsed))
    return result


_SKIP = object()


def _reindex(rejected: list[tuple[int, str]], parsed: list[Any]) -> list[tuple[int, str]]:
    """Map indexes among the parsed lines back to indexes among all lines."""
    original = [i for i, p in enumerate(parsed) if p is not _SKIP]
    return [(original[i], reason) for i, reason in rejected]


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=EVENT_SCHEMA)


def normalize_event(row: Any, stamp: Stamp) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise EventError(f"an event must be a JSON object, got {type(row).__name__}")
    event: dict[str, Any] = {}
    attrs: dict[str, str] = {}
    for key, value in row.items():
        if key in AGENT_STAMPED or value is None:
            continue
        if key not in EVENT_FIELDS:
            attrs[str(key)] = _attr_text(value)
            continue
        event[key] = _convert(key, value)
    if not event.get("kind"):
        raise EventError("field 'kind' is required")
    attrs.update(event.get("attrs") or {})
    event["attrs"] = attrs or None
    split_nonfinite(event)
    event.setdefault("event_id", new_event_id())
    event.setdefault("time", stamp.received_ns)
    if stamp.node_id:
        event.setdefault("node_id", stamp.node_id)
    if stamp.host:
        event.setdefault("host", stamp.host)
    event["pid"] = stamp.pid
    event["uid"] = stamp.uid
    event["received"] = stamp.received_ns
    return event


def _convert(key: str, value: Any) -> Any:
    if key in _STRING_FIELDS:
        if not isinstance(value, str):
            raise EventError(f"field {key!r} must be a string, got {type(value).__name__}")
        return value
    if key in _INT_FIELDS:
        return _integer(key, value)
    if key == "duration_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EventError(f"field 'duration_s' must be a number, got {type(value).__name__}")
        if value < 0:
            raise EventError(f"field 'duration_s' must not be negative, got {value}")
        return float(value)
    if key == "time":
        return _time_ns(value)
    if key == "metrics":
        return _metrics(value)
    if key == "nonfinite":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise EventError("field 'nonfinite' must be a list of strings")
        return value
    if key == "attrs":
        if not isinstance(value, dict):
            raise EventError(f"field 'attrs' must be an object, got {type(value).__name__}")
        # a null says nothing: left out, as a null top-level field and the emitter's None are
        return {str(k): _attr_text(v) for k, v in value.items() if v is not None}
    raise EventError(f"field {key!r} is stamped by the agent")  # pragma: no cover


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(f"field {key!r} must be an integer, got {type(value).__name__}")
    limit = _INT64_LIMIT if EVENT_FIELDS[key] == "int64" else _INT32_LIMIT
    if not -limit <= value < limit:
        raise EventError(f"field {key!r} is out of range: {value}")
    return value


def _time_ns(value: Any) -> int:
    """Integer nanoseconds since the epoch, or an RFC 3339 / ISO 8601 string."""
    if isinstance(value, bool):
        raise EventError("field 'time' must be integer nanoseconds or an RFC 3339 string")
    if isinstance(value, int):
        if not 0 <= value < _INT64_LIMIT:
            raise EventError(f"field 'time' is out of range: {value}")
        if value < EARLIEST_TIME_NS:
            raise EventError(_other_unit(value))
        return value
    if isinstance(value, str):
        ns = parse_rfc3339_ns(value)
        if not 0 <= ns < _INT64_LIMIT:
            raise EventError(f"field 'time' is out of range: {value!r}")
        return ns
    raise EventError("field 'time' must be integer nanoseconds or an RFC 3339 string")


# the units an integer time is mistaken for, largest first, with nanoseconds per unit
_UNITS = (("microseconds", 1_000), ("milliseconds", 1_000_000), ("seconds", 1_000_000_000))


def _other_unit(value: int) -> str:
    """Why an integer time before 1973 is refused: the unit it looks like, with what it
    would be in nanoseconds, where one fits."""
    said = f"field 'time' must be nanoseconds since 1970 (or an RFC 3339 string), got {value}"
    for unit, ns in _UNITS:
        if EARLIEST_TIME_NS <= value * ns < _INT64_LIMIT:
            return f"{said}, which looks like {unit}: as nanoseconds, {value * ns}"
    return f"{said}, a time before 1973"


def parse_rfc3339_ns(text: str) -> int:
    """RFC 3339 with up to nine fractional digits, to integer nanoseconds (UTC)."""
    body, _, rest = text.partition(".")
    fraction = ""
    zone = ""
    if rest:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        fraction, zone = rest[:digits], rest[digits:]
    else:
        for marker in ("Z", "z", "+"):
            if marker in body[10:]:
                at = body.index(marker, 10)
                body, zone = body[:at], body[at:]
                break
    try:
        whole = datetime.fromisoformat(body + (zone.replace("z", "Z") or "+00:00"))
    except (ValueError, OverflowError):
        raise EventError(f"time {text!r} is not RFC 3339") from None
    nanos = int((fraction + "000000000")[:9]) if fraction else 0
    return int(whole.timestamp()) * 1_000_000_000 + nanos


def _metrics(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise EventError(f"field 'metrics' must be an object, got {type(value).__name__}")
    out: dict[str, float] = {}
    for name, number in value.items():
        if isinstance(number, bool) or (
            not isinstance(number, (int, float)) and number is not None
        ):
            raise EventError(f"metric {name!r} must be a number, got {type(number).__name__}")
        out[str(name)] = math.nan if number is None else float(number)
    return out


def split_nonfinite(event: dict[str, Any]) -> None:
    """Move NaN and infinite metrics into `nonfinite`, never recording them as numbers."""
    metrics = event.get("metrics")
    if not metrics:
        return
    bad = [name for name, v in metrics.items() if not math.isfinite(v)]
    if bad:
        event["metrics"] = {n: v for n, v in metrics.items() if math.isfinite(v)} or None
        event["nonfinite"] = sorted(set(event.get("nonfinite") or []) | set(bad))


def _attr_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
