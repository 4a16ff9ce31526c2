"""One field of a caller's event into its column: coerced to the column's type where the
value has a faithful form there (numpy and torch scalars, integral values, aware
datetimes, str() for text columns; NaN and infinite metrics become `nonfinite` names).
A value with no such form (text for a number, a bool for a step) is sent as it is, so
that the agent refuses the event with its one rule and wording (docs/event-schema.md,
"Bad input"), and the emitter counts the refusal: it is never stored as NULL with the
text in attrs. Nothing here raises for a caller's value: whatever has no JSON form is
written as its str(), or its type name when even str() fails. Runs in the sender thread."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from emitters.fields import AGENT_STAMPED, EARLIEST_TIME_NS, EVENT_FIELDS

_INT64 = 2**63
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_INT_LIMITS = {"int32": 2**31, "int64": _INT64}
_STAMPED = "stamped by the agent"
_COLUMNS = {name: _STAMPED if name in AGENT_STAMPED else column
            for name, column in EVENT_FIELDS.items()}
_JSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
# Per sender thread: how many values were left for the agent to judge, so that the rows
# that hold one are encoded with their types checked (emitters/outbox.py).
_left_to_agent = threading.local()


def values_left_to_agent() -> int:
    """Values this thread has sent as they are for the agent to refuse, so far."""
    return int(getattr(_left_to_agent, "count", 0))


def _for_agent(value: Any) -> Any:
    """A value that does not fit its column, as the agent will judge it: JSON's own
    types as they are, anything else as its text (the agent says what it got)."""
    _left_to_agent.count = values_left_to_agent() + 1
    if type(value) in (str, bool, float) or (type(value) is int and -_INT64 <= value < _INT64):
        return value
    return text(value)


def apply_fields(event: dict[str, Any], attrs: dict[str, str], fields: Mapping[Any, Any]) -> None:
    for key, value in fields.items():
        column = _COLUMNS.get(key)
        if column is None:
            if value is not None:
                attrs[key if type(key) is str else text(key)] = (
                    value if type(value) is str else text(value))
        elif value is None or column is _STAMPED:
            continue
        elif column == "string":
            event[key] = value if type(value) is str else text(value)
        # The common cases first, without calls: this runs for every field of every event.
        elif column == "int64" and type(value) is int and -_INT64 <= value < _INT64:
            event[key] = value
        elif column == "float64" and type(value) is float and value - value == 0.0:
            event[key] = value  # finite: inf - inf and nan - nan are nan
        else:
            _typed(event, attrs, key, column, value)


def _typed(event: dict[str, Any], attrs: dict[str, str], key: str, column: str, value: Any) -> None:
    if column in _INT_LIMITS:
        number = as_int(value, _INT_LIMITS[column])
        event[key] = _for_agent(value) if number is None else number
    elif column == "float64":
        real = as_float(value)
        if real is None:
            event[key] = _for_agent(value)
        elif not math.isfinite(real):
            # JSON has no NaN: sent as its text, which the agent refuses as every door
            # does (a duration that is not a number), and stats() counts
            event[key] = _for_agent(text(value))
        else:
            event[key] = real
    elif column == "timestamp_ns":
        _time(event, attrs, key, value)
    elif column == "map_string_float64" and isinstance(value, Mapping):
        add_metrics(event, attrs, value)
    elif column == "list_string" and isinstance(value, (list, tuple, set, frozenset)):
        names = set(event.get(key) or ()) | {text(v) for v in value}
        event[key] = sorted(names)
    elif column == "map_string_string" and isinstance(value, Mapping):
        for k, v in value.items():
            if v is not None:
                attrs[text(k)] = text(v)
    else:
        event[key] = _for_agent(value)


def _time(event: dict[str, Any], attrs: dict[str, str], key: str, value: Any) -> None:
    if isinstance(value, datetime) and value.tzinfo is not None:
        ns = (value - _EPOCH) // _MICROSECOND * 1000  # exact: no float seconds
        if EARLIEST_TIME_NS <= ns < _INT64:
            event[key] = ns
        elif 0 <= ns < _INT64:  # a date before 1973, as a date: an integer would be refused
            event[key] = _for_agent(value.isoformat())
        else:  # before 1970 or past 2262: no nanosecond column holds it
            attrs[key] = value.isoformat()
    elif isinstance(value, str):
        event[key] = value  # RFC 3339: the agent parses it and says so when it cannot
    else:
        number = as_int(value, 2**63)
        refused = number is None or number < EARLIEST_TIME_NS  # the agent says why
        event[key] = _for_agent(value) if refused else number


def add_metrics(event: dict[str, Any], attrs: dict[str, str], values: Mapping[Any, Any]) -> None:
    """Finite numbers into `metrics`, NaN/inf/None names into `nonfinite`; anything else
    is left for the agent to refuse (a metric must be a number)."""
    metrics: dict[str, Any] = event.get("metrics") or {}
    nonfinite: set[str] = set(event.get("nonfinite") or ())
    for key, value in values.items():
        name = key if type(key) is str else text(key)
        real = as_float(value)
        if value is None:
            nonfinite.add(name)  # as the agent files a null metric: named, not a number
        elif real is None:
            metrics[name] = _for_agent(value)
        elif math.isfinite(real):
            metrics[name] = real
        else:
            nonfinite.add(name)
    if metrics:
        event["metrics"] = metrics
    if nonfinite:
        event["nonfinite"] = sorted(nonfinite)


def as_int(value: Any, limit: int) -> int | None:
    if type(value) is not int:
        if isinstance(value, (bool, str, bytes)):
            return None
        try:
            value = value.__index__()
        except Exception:
            return None
        if type(value) is not int:
            return None
    return value if -limit <= value < limit else None


def as_float(value: Any) -> float | None:
    if type(value) is float:
        return value
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        return float(value)  # ints, bools, numpy and torch scalars
    except Exception:
        return None


def text(value: Any) -> str:
    """A value as attrs text: JSON for containers and literals, str() for the rest."""
    if type(value) is str:
        return value
    try:
        return _text(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return str.__str__(value)
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        return repr(value)
    if isinstance(value, (dict, list, tuple)):
        with contextlib.suppress(Exception):
            return orjson.dumps(value, default=_json_default, option=_JSON_OPTIONS).decode()
    return _str_or_type_name(value)


def _json_default(value: Any) -> str:
    return _str_or_type_name(value)


def _str_or_type_name(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def scrub(value: Any) -> Any:
    """The value with every string made valid UTF-8 (lone surrogates become escapes)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value
