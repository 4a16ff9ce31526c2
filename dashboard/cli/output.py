"""Printing query results: an aligned table for people, JSON or CSV for programs."""

from __future__ import annotations

import csv
import io
import math
import re
from typing import Any

import orjson

from dashboard.lake.results import Result
from sinks.artifacts.layout import ARTIFACTS_ROOT

MAX_CELL = 60
SMALL_FLOAT = 0.01  # below this, a float keeps significant digits, not three decimals
_DIGEST = re.compile(r"^[0-9a-f]{64}$")  # a sha256, as `sha256sum` prints it
_LAKE_KEY = f"{ARTIFACTS_ROOT}/"  # a shipped file's key, which `cp lake/<lake_key>` copies
_ISO = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d{3})?\d*Z$")


def render(result: Result, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(result.records(), option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "csv":
        return to_csv(result)
    return to_table(result)


def to_csv(result: Result) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow([_csv_cell(v) for v in row])
    return out.getvalue()


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return "" if value is None else value


def to_table(result: Result) -> str:
    if not result.columns:
        return "(no columns)\n"
    cells = [[table_cell(v) for v in row] for row in result.rows]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in result.rows)
               for i in range(len(result.columns))]
    widths = [max([len(c)] + [len(row[i]) for row in cells])
              for i, c in enumerate(result.columns)]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    lines = [line(result.columns), line(["-" * w for w in widths])]
    lines += [line(row) for row in cells]
    count = len(result.rows)
    footer = f"({count} row{'s' if count != 1 else ''}"
    if result.total is not None and result.total != count:
        footer += f" of {result.total}"
    lines.append(footer + ")")
    return "\n".join(lines) + "\n"


def table_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return float_cell(value)
    if isinstance(value, dict):
        text = ", ".join(f"{k}={spread(v)}" for k, v in value.items())
        if all(_is_metric(v) for v in value.values()):
            # a step's metrics whole: they are what `steps` is read for, and a cut one
            # reads as another number (`lr=0.…`); each takes a few characters
            return text.replace("\r", "").replace("\n", " ⏎ ")
    elif isinstance(value, list):
        text = ", ".join(table_cell(v) for v in value)
    else:
        text = str(value)
        iso = _ISO.match(text)
        if iso:
            text = f"{iso.group(1)} {iso.group(2)}{iso.group(3) or ''}"
    text = text.replace("\r", "").replace("\n", " ⏎ ")
    if len(text) <= MAX_CELL or _DIGEST.match(text) or text.startswith(_LAKE_KEY):
        # a digest or a lake key whole: cut, one checks and the other names nothing
        return text
    return text[: MAX_CELL - 1] + "…"


def _is_metric(value: Any) -> bool:
    """A number, or a metric's spread {min, max, mean}: not text, which may be long."""
    if isinstance(value, dict):
        return all(_is_metric(v) for v in value.values())
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def float_cell(value: float) -> str:
    """Three decimals, as durations in seconds read; a small value (a learning rate, an
    op's 198 us) keeps three significant digits instead of reading 0.000."""
    if value != 0 and abs(value) < SMALL_FLOAT:
        return f"{value:.3g}"
    return f"{value:.3f}" if abs(value) < 1e12 else f"{value:.4g}"


def spread(value: Any) -> str:
    """A metric spread {min, max, mean} as "min..max ~mean"; anything else as a cell."""
    if isinstance(value, dict) and {"min", "max", "mean"} <= set(value):
        lo, hi, mean = (metric_cell(value[k]) for k in ("min", "max", "mean"))
        return lo if lo == hi else f"{lo}..{hi} ~{mean}"
    return metric_cell(value)


def metric_cell(value: Any) -> str:
    """A metric as its number reads, not as seconds: tokens=4096 and lr=0.1, where three
    decimals read 4096.000 and 0.100; four significant digits at most below 1000."""
    if not isinstance(value, float) or not math.isfinite(value):
        return table_cell(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 1000:
        return f"{value:.1f}" if abs(value) < 1e12 else f"{value:.4g}"
    return f"{value:.4g}"
