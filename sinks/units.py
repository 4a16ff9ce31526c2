"""Human-friendly sizes and durations in configuration ("4GiB", "5m"), and the bounds of
the numbers both HTTP ports take."""

from __future__ import annotations

import re
from typing import Final

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MOST_CONNECTIONS: Final = 1_000_000  # the highest connection cap either HTTP port takes


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "128MiB" or "4GB"."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as \"64MiB\"")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if not isinstance(value, str):
        raise ValueError("expected a size such as \"64MiB\"")
    match = _SIZE.match(value)
    unit = (match.group(2) or "").lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size such as \"64MiB\"")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def size_text(size: int) -> str:
    """A size as the configuration writes it: "32MiB" where it is whole in a binary unit,
    else bytes (parse_size reads it back)."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def parse_duration(value: object) -> float:
    """Seconds from a number or a string such as "5m", "250ms", "1h"."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as \"5m\"")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("expected a duration such as \"5m\"")
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a duration such as \"30s\" or \"5m\"")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or ""]


def parse_positive_size(value: object) -> int:
    """A size that must be larger than zero: a frame, a body or a file of 0 bytes would
    refuse everything, or roll on every write."""
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"{value!r} must be larger than zero")
    return size


def parse_positive_duration(value: object) -> float:
    """A duration that must be longer than zero: an interval or a timeout of 0 would
    spin (heartbeats, retries) or fire at once (a frame split across two reads)."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def parse_bool(value: object) -> bool:
    """A TOML boolean only: "no" or "false" as a string is a mistake, not a truthy value."""
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false (a TOML boolean, unquoted)")
    return value


def parse_int(value: object) -> int:
    """A TOML integer only: 1.5 or "10" is refused rather than truncated or guessed."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number (a TOML integer, unquoted)")
    return value
