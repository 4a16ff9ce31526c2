"""The task fold's SQL (dashboard/sql/fold.sql by section, and the macros of the one owner
of the fold, sinks/fragments/task_fold.py) and the few DuckDB helpers its statements share
(dashboard/lake/fold.py, fold_place.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib import resources

import duckdb

from dashboard.lake.views import micros
from sinks.fragments.dialects import dialect
from sinks.fragments.task_fold import merge_select, merge_select_split, partial_select


def lake_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB set up as every reader of a lake has it: times shown in UTC,
    Parquet footers read once."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET parquet_metadata_cache = true")
    return con


def read_local(con: duckdb.DuckDBPyConnection) -> None:
    """Set up `con` for a lake on a local disk: DuckDB keeps no copy of the files' bytes
    (its external file cache), which the kernel's page cache holds anyway. Copying them
    cost 0.3 of the 3.7 CPU s of a first open of 10 million events, which reads the
    fragments four times. (S3 keeps the cache: there it saves downloads.)"""
    with suppress(duckdb.Error):  # a DuckDB without it
        con.execute("SET enable_external_file_cache = false")


def task_fold_macros() -> str:
    """fold_partial_of, fold_merge_of and fold_merge_split_of, from the one owner of the
    task fold (the agent writes its task fragments with the same SQL)."""
    duck = dialect("duckdb")
    return (f"CREATE OR REPLACE TEMP MACRO fold_partial_of(rows) AS TABLE "
            f"{partial_select(duck, 'query_table(rows)')};\n"
            f"CREATE OR REPLACE TEMP MACRO fold_merge_of(parts) AS TABLE "
            f"{merge_select(duck, 'query_table(parts)')};\n"
            f"CREATE OR REPLACE TEMP MACRO fold_merge_split_of(parts) AS TABLE "
            f"{merge_select_split(duck, 'query_table(parts)')};\n")


def read_sql(name: str) -> str:
    return resources.files("dashboard").joinpath("sql", name).read_text("utf-8")


def sql_sections(name: str = "fold.sql") -> dict[str, str]:
    text = read_sql(name)
    parts = re.split(r"^-- @(\w+)\s*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


@contextmanager
def threads(cur: duckdb.DuckDBPyConnection, threads: int) -> Iterator[int]:
    """Run with DuckDB's `threads` at `threads` (0: as it is), then restore it; yields
    the setting before (0 when left as it is). The setting is the database's: a query
    on another cursor meanwhile gets it too."""
    if threads <= 0:
        yield 0
        return
    found = cur.execute("SELECT current_setting('threads')").fetchone()
    before = int(found[0]) if found else threads
    cur.execute(f"SET threads = {int(threads)}")
    try:
        yield before
    finally:
        cur.execute(f"SET threads = {before}")


def project(column: str, duckdb_type: str, present: bool) -> str:
    """One column of the fold's rows: missing ones as NULL; `time` cast to microseconds
    (DuckDB 2 reads the Parquet nanoseconds as TIMESTAMPTZ_NS, 1.x as TIMESTAMPTZ)."""
    if not present:
        return f"CAST(NULL AS {duckdb_type}) AS {column}"
    if duckdb_type == "TIMESTAMPTZ":
        return f"{micros(column)} AS {column}"
    return column


def insert(cur: duckdb.DuckDBPyConnection, table: str, rows: list[tuple[object, ...]]) -> None:
    """Insert rows in one statement (executemany runs one statement per row)."""
    if not rows:
        return
    columns = {f"c{i}": list(values) for i, values in enumerate(zip(*rows, strict=True))}
    cur.execute(f"INSERT INTO {table} SELECT {', '.join(f'unnest(${c})' for c in columns)}",
                columns)
