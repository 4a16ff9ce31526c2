"""Checks of the agent's configuration tables: unknown keys, and parsers of values that
return the value or raise ValueError saying why (the caller names the key)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sinks.units import MOST_CONNECTIONS, parse_duration, parse_int


def check_keys(
    table: Mapping[str, Any], allowed: set[str], prefix: str, problems: list[str]
) -> None:
    for key in table:
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
            hint = f"did you mean {near[0]!r}? " if near else ""
            problems.append(f"{prefix}{key}: unknown key ({hint}allowed: "
                            f"{', '.join(sorted(allowed))})")


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (quote it)")
    return value


def path_or(default: Any) -> Any:
    """A path from a string, `~` expanded as for the sinks' urls and `[[files]]` (and as
    `evagg emit` reads the socket); "" (or no key) means the user default."""
    def parse(value: Any) -> Path:
        found = string(value)
        return Path(found).expanduser() if found else Path(default())

    return parse


def group(value: Any) -> str | None:
    return string(value) or None


def octal_mode(value: Any) -> int:
    text = str(value)
    if not re.fullmatch(r"0?[0-7]{3}", text):
        raise ValueError(f'{text!r} is not an octal file mode such as "0660"')
    return int(text, 8)


def listen(value: Any) -> str:
    text = str(value)
    if text == "":
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f'{text!r} is not host:port, such as "127.0.0.1:4040"')
    return text


def read_token(value: Any) -> str:
    try:
        token = Path(str(value)).read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {value}: {exc.strerror}; create it "
                         "(the token on one line) or remove the key") from None
    if not token:
        raise ValueError(f"the token file {value} is empty; write the token in it")
    return token


def connection_cap(value: Any) -> int:
    if not 1 <= parse_int(value) <= MOST_CONNECTIONS:
        raise ValueError(f"{value!r} is not a whole number from 1 to {MOST_CONNECTIONS}")
    return int(value)


def label_cap(value: Any) -> int:
    if not 1 <= parse_int(value) <= 100_000:
        raise ValueError(f"{value!r} is not a whole number from 1 to 100000")
    return int(value)


def one_of(*choices: str) -> Any:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return str(value)

    return parse


def grace(value: Any) -> float:
    """`inferred_end_grace`: a duration, or "off" (the same as "0s": infer nothing)."""
    if value == "off":
        return 0.0
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(f'{value!r} is not a duration such as "30s", or "off"') from None
