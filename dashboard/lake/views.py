"""The evagg views: every dashboard/sql/*.sql file, run in dependency order.

The files fixed below run first, in this order; any other .sql file in the folder
runs after them in name order, except those in NOT_VIEWS (statements that
dashboard/lake/fold.py runs itself). `{{source}}` in a file is replaced with the relation
that reads the store's Parquet files (dashboard/lake/store.py builds it); `{{time_us}}` and
`{{received_us}}` with those columns in microseconds (`micros`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

import duckdb

from dashboard.lake.errors import StoreUnavailable
from sinks.fragments.build import duckdb_micros

ORDER = (
    "keys.sql",
    "events.sql",
    "tasks.sql",
    "ends.sql",
    "ops.sql",
    "steps.sql",
    "spans.sql",
    "agents.sql",
    "summaries.sql",
)
NOT_VIEWS = ("fold.sql",)
SOURCE_MARK = "{{source}}"
SOURCE_FILE = "events.sql"
SOURCE_VIEW = "events_raw"  # SOURCE_FILE's view, the only one that reads SOURCE_MARK
_SOURCE_STATEMENT = re.compile(rf"^CREATE OR REPLACE VIEW {SOURCE_VIEW} AS\b.*?;$",
                               re.MULTILINE | re.DOTALL)
# DuckDB 2 reads Parquet nanosecond timestamps as TIMESTAMPTZ_NS; 1.x as TIMESTAMPTZ.
NANOS_TYPES = int(duckdb.__version__.split(".")[0]) >= 2


def micros(column: str) -> str:
    """SQL for a timestamp column as TIMESTAMPTZ in microseconds, cut down, so that DuckDB
    1.x and 2 give the same times (sinks/fragments/build.py owns the expression). On 1.x
    the column is that already, and left bare so that filters on it reach the scan."""
    return duckdb_micros(column, NANOS_TYPES)


def fill_marks(text: str, source_sql: str) -> str:
    return (text.replace(SOURCE_MARK, source_sql).replace("{{time_us}}", micros("time"))
            .replace("{{received_us}}", micros("received")))


def view_files() -> list[tuple[str, str]]:
    """(file name, SQL text) for every view file, in the order they must run."""
    folder = resources.files("dashboard").joinpath("sql")
    texts = {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".sql") and entry.name not in NOT_VIEWS
    }
    first = [name for name in ORDER if name in texts]
    rest = sorted(name for name in texts if name not in ORDER)
    return [(name, texts[name]) for name in first + rest]


def create_views(con: duckdb.DuckDBPyConnection, source_sql: str,
                 instead: Mapping[str, str] | None = None) -> list[str]:
    """Create (or replace) every view over `source_sql`; returns the files that ran.
    `instead` gives SQL to run in a file's place (the task fold's views for tasks.sql):
    the views after it bind against what it made."""
    done: list[str] = []
    for name, text in view_files():
        try:
            con.execute(fill_marks((instead or {}).get(name, text), source_sql))
        except duckdb.Error as exc:
            raise StoreUnavailable(f"view file dashboard/sql/{name} failed: {exc}") from None
        done.append(name)
    return done


def replace_source(con: duckdb.DuckDBPyConnection, source_sql: str) -> None:
    """Point the one view over the files (events.sql's events_raw) at `source_sql`. The
    other views read it by name and are bound again on every query, so while the files'
    columns stay the same (`view_schema(con, SOURCE_VIEW)`) this is all a new listing
    needs: binding every view again took half a CPU second on each new file."""
    try:
        con.execute(fill_marks(_source_statement(), source_sql))
    except duckdb.Error as exc:
        raise StoreUnavailable(f"view file dashboard/sql/{SOURCE_FILE} failed: {exc}"
                               ) from None


@cache
def _source_statement() -> str:
    """SOURCE_VIEW's CREATE, read once: replace_source runs on every new file."""
    found = _SOURCE_STATEMENT.search(dict(view_files())[SOURCE_FILE])
    assert found is not None, f"{SOURCE_FILE} lost its {SOURCE_VIEW} view"
    return found.group(0)


def view_schema(con: duckdb.DuckDBPyConnection, view: str) -> list[tuple[str, str]]:
    """The column names and types of a view, from the catalog (empty when it does not
    exist)."""
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = $view ORDER BY ordinal_position",
        {"view": view},
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def view_columns(con: duckdb.DuckDBPyConnection, view: str) -> list[str]:
    """The column names of a view (empty when it does not exist)."""
    return [name for name, _ in view_schema(con, view)]
