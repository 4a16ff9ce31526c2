"""The few expressions in which DuckDB, Spark and Trino (Athena's engine) differ, for the
task fold's SQL (sinks/fragments/task_fold.py) and the statements `evagg query ddl`
prints (sinks/fragments/ddl.py).

Everything else the fold writes (CASE, coalesce, min/max, window functions, BIGINT
arithmetic) reads the same in all of them. Each engine's arg_max skips rows whose key is
NULL; the fold only ever asks for a value where its key is not NULL, so the three agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

DialectName = Literal["duckdb", "spark", "trino", "athena"]
DIALECTS: Final[tuple[DialectName, ...]] = ("duckdb", "spark", "trino", "athena")
SOURCE_FILE_COLUMN: Final = "evagg_file"  # DuckDB's raw events: the file each row came from


@dataclass(frozen=True)
class Dialect:
    name: DialectName

    @property
    def _trino(self) -> bool:
        return self.name in ("trino", "athena")

    def arg_max(self, value: str, key: str) -> str:
        return f"arg_max({value}, {key})" if self.name == "duckdb" else f"max_by({value}, {key})"

    def arg_min(self, value: str, key: str) -> str:
        return f"arg_min({value}, {key})" if self.name == "duckdb" else f"min_by({value}, {key})"

    def map_get(self, column: str, key: str) -> str:
        """A map's value for a key, NULL when the key is absent (Trino's subscript fails)."""
        return f"element_at({column}, '{key}')" if self._trino else f"{column}['{key}']"

    def epoch_us(self, column: str) -> str:
        """Microseconds since the epoch of a timestamp, as a BIGINT."""
        if self.name == "duckdb":
            return f"epoch_us({column})"
        if self.name == "spark":
            return f"unix_micros({column})"
        return f"CAST(round(to_unixtime({column}) * 1e6) AS BIGINT)"

    def div(self, left: str, right: str) -> str:
        """Integer division of two BIGINTs (the fold's keys are never negative)."""
        if self.name == "duckdb":
            return f"({left} // {right})"
        if self.name == "spark":
            return f"({left} DIV {right})"
        return f"({left} / {right})"

    def struct(self, fields: dict[str, str]) -> str:
        """A struct of VARCHAR fields (the fold's one struct is the error)."""
        if self.name == "duckdb":
            return "{" + ", ".join(f"'{k}': {v}" for k, v in fields.items()) + "}"
        if self.name == "spark":
            return "named_struct(" + ", ".join(f"'{k}', {v}" for k, v in fields.items()) + ")"
        row_type = ", ".join(f"{k} VARCHAR" for k in fields)
        return f"CAST(ROW({', '.join(fields.values())}) AS ROW({row_type}))"

    def try_int(self, expression: str) -> str:
        kind = "INT" if self.name == "spark" else "INTEGER"
        return f"TRY_CAST({expression} AS {kind})"

    @property
    def double_type(self) -> str:
        return "DOUBLE"

    def source_file(self, alias: str) -> str:
        """The path of the Parquet file a row of `alias` (the raw events) was read from:
        DuckDB's `evagg_file` column (sinks/fragments/ddl.py reads it with the rows),
        Spark's input_file_name(), Trino's hidden "$path"."""
        if self.name == "duckdb":
            return f"{alias}.{SOURCE_FILE_COLUMN}"
        if self.name == "spark":
            return "input_file_name()"
        return f'{alias}."$path"'

    def quote(self, identifier: str) -> str:
        """An identifier that may be a reserved word (`date`, `hour`)."""
        return f"`{identifier}`" if self.name == "spark" else f'"{identifier}"'


def dialect(name: str) -> Dialect:
    if name not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {name!r}: choose one of {', '.join(DIALECTS)}")
    return Dialect(name)
