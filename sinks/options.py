"""Reading one option of a [[sinks]] table: the shared parsers of every sink's options.

Each sink type's options class (sinks/http/options.py, sinks/parquet/options.py) reads
its keys through `option()`, so an error names its key ("roll_max_bytes: 'abc' is not a
size") and a value of the wrong type is a SinkOptionError, never a TypeError traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sinks.units import parse_int

T = TypeVar("T")
S = TypeVar("S", bound=str)


class SinkOptionError(ValueError):
    """One sink option that cannot be used; `key` is its name in the config."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def option(table: Mapping[str, Any], key: str, default: T, parse: Callable[[Any], T]) -> T:
    """`table[key]` parsed, or `default` when the key is absent (the default is not parsed:
    it is already the value the sink uses)."""
    if key not in table:
        return default
    try:
        return parse(table[key])
    except (ValueError, TypeError) as exc:
        raise SinkOptionError(key, str(exc)) from None


def at_least(lowest: int) -> Callable[[Any], int]:
    """A parser of whole numbers no smaller than `lowest`."""

    def parse(value: Any) -> int:
        number = parse_int(value)
        if number < lowest:
            raise ValueError(f"{value!r} must be at least {lowest}")
        return number

    return parse


def int_between(lowest: int, highest: int, what: str) -> Callable[[Any], int]:
    """A parser of whole numbers from `lowest` to `highest`; `what` names the range."""

    def parse(value: Any) -> int:
        number = parse_int(value)
        if not lowest <= number <= highest:
            raise ValueError(f"{value!r} is not {what} from {lowest} to {highest}")
        return number

    return parse


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (quote it)")
    return value


def optional_text(value: Any) -> str | None:
    return None if value is None else text(value)


def one_of(*choices: S) -> Callable[[Any], S]:
    """A parser that takes exactly one of `choices`."""

    def parse(value: Any) -> S:
        for choice in choices:
            if value == choice:
                return choice
        raise ValueError(f"{value!r} is not one of {', '.join(choices)}")

    return parse


def text_table(value: Any) -> dict[str, str]:
    """A TOML table of name = "value"; each value must be a string."""
    if not isinstance(value, dict):
        raise ValueError("must be a table of name = value")
    for name, item in value.items():
        if not isinstance(item, str):
            raise ValueError(f"{name!r}: the value must be a string (quote it)")
    return {str(name): item for name, item in value.items()}
