"""Query results as plain Python values, the same for the CLI and the JSON API.

Timestamps become ISO 8601 text in UTC ("2025-03-01T12:00:00.123456Z"), maps become
dicts, decimals become floats (or ints), NaN becomes None, so every row can go to
JSON or CSV as it is. Rows come from DuckDB's own `fetchall` rather than through Arrow,
so that `evagg query` never loads pyarrow (a tenth of a second of every command).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb


@dataclass(slots=True)
class Result:
    columns: list[str]
    rows: list[list[Any]]
    total: int | None = None  # matching rows before LIMIT/OFFSET, where a query counts them
    extra: dict[str, Any] = field(default_factory=dict)

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def column(self, name: str) -> list[Any]:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def without(self, name: str) -> Result:
        """The same result minus one (helper) column."""
        if name not in self.columns:
            return self
        index = self.columns.index(name)
        columns = self.columns[:index] + self.columns[index + 1:]
        rows = [row[:index] + row[index + 1:] for row in self.rows]
        return Result(columns, rows, self.total, self.extra)


def from_cursor(cursor: duckdb.DuckDBPyConnection) -> Result:
    """The rows of the cursor's last query (one that returns rows)."""
    columns = [column[0] for column in cursor.description or ()]
    return Result(columns, [[plain(v) for v in row] for row in cursor.fetchall()])


def plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime):
        return iso_time(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):  # a MAP or a STRUCT
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def iso_time(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(timespec="microseconds") + "Z"
