"""The statements `evagg query ddl` prints: a lake's `events` and `tasks` in another
engine's SQL (Spark, Trino, Athena, or a plain DuckDB without evagg).

Four relations, the same names in every engine:

* `events_raw`: every stored row of the event files (`date=/hour=/node=/*.parquet`),
  with the hive columns `date` (DATE), `hour` (INTEGER) and `node`;
* `events`: one row per (event_id, kind), the earliest received copy, as evagg's own
  `events` view (dashboard/sql/events.sql);
* `task_fragments`: the task fragments under `_tasks/` (the partial fold of one
  node-hour each, sinks/fragments/task_fold.py), with the same hive columns;
* `tasks`: one row per task attempt, the fragments merged with the partial fold of the
  raw rows no fragment covers (every file of a partition (date, hour, node) without one,
  and the part files written into an hour after its merge): tasks.sql's `tasks`, before
  the ends evagg infers for attempts a dead process left open.

Where the statements point is `ddl_lake.py`'s, their column types `ddl_types.py`'s.
Everything here returns text; the command line prints it.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

import pyarrow as pa

from sinks.fragments.ddl_lake import Lake, lake_has_fragments
from sinks.fragments.ddl_types import (
    PARTITION_TYPES,
    columns_of,
    fragment_schema,
    partitions,
    sql_type,
    table_engine,
)
from sinks.fragments.dialects import (
    DIALECTS,
    SOURCE_FILE_COLUMN,
    Dialect,
    DialectName,
    dialect,
)
from sinks.fragments.task_fold import (
    FOLD_COLUMNS,
    attempts_select,
    merge_select,
    partial_select,
)
from sinks.locations import redacted_endpoint
from sinks.parquet.layout import COMPACTED_PREFIX, EVENT_GLOB, FRAGMENT_SUFFIX, TASKS_ROOT
from sinks.schema import EVENT_SCHEMA

EVENTS_RAW: Final = "events_raw"
EVENTS: Final = "events"
FRAGMENTS: Final = "task_fragments"
TASKS: Final = "tasks"
DEFAULT_SCHEMA: Final = "evagg"  # Trino's and Athena's schema (database) for the tables
DEFAULT_CATALOG: Final = "hive"  # Trino's catalog: a Hive connector



def literal(d: Dialect, text: str) -> str:
    """A SQL string literal (Spark's take backslash escapes; the others double quotes)."""
    if d.name == "spark":
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "'" + text.replace("'", "''") + "'"


def _ddl_quote(d: Dialect, name: str) -> str:
    return f"`{name}`" if d.name in ("spark", "athena") else f'"{name}"'


def _column_list(d: Dialect, columns: list[tuple[str, pa.DataType]]) -> str:
    engine = table_engine(d)
    return ",\n".join(f"    {_ddl_quote(d, n)} {sql_type(engine, t)}" for n, t in columns)


class _Names:
    """The relations' names as `d`'s statements write them (Trino: catalog.schema.name)."""

    def __init__(self, d: Dialect, schema: str, catalog: str) -> None:
        prefix = {"trino": f"{catalog}.{schema}.", "athena": f"{schema}."}.get(d.name, "")
        self.events_raw = prefix + EVENTS_RAW
        self.events = prefix + EVENTS
        self.fragments = prefix + FRAGMENTS
        self.tasks = prefix + TASKS
        self.catalog, self.schema = catalog, schema


def statements(dialect_name: str, location: str, *, fragments: bool = True,
               schema: str = DEFAULT_SCHEMA, catalog: str = DEFAULT_CATALOG,
               endpoint_url: str | None = None) -> list[str]:
    """The statements, in the order they run, each without its `;`. The first carries
    the header comment. `fragments=False` declares `task_fragments` as an empty view
    (for a lake without `_tasks/`, which Spark, Trino and DuckDB refuse to read).
    `endpoint_url`: the S3-compatible store the lake is on, which the header's DuckDB
    secret then names."""
    d = dialect(dialect_name)
    lake = Lake.parse(location)
    check_names(schema, catalog)
    names = _Names(d, schema, catalog)
    out = [*_setup(d, schema, catalog), *_events_raw(d, lake, names), _events(d, names)]
    out += _fragments(d, lake, names) if fragments else [_no_fragments(d, names)]
    out.append(_tasks(d, names))
    out[0] = _header(d, lake, fragments, schema, catalog, endpoint_url) + out[0]
    return out


def script(dialect_name: str, location: str, *, fragments: bool = True,
           schema: str = DEFAULT_SCHEMA, catalog: str = DEFAULT_CATALOG,
           endpoint_url: str | None = None) -> str:
    """The statements as one text: each ends with `;` and a blank line, and no other line
    ends with `;`, so that splitting at a line's last `;` gives the statements."""
    parts = statements(dialect_name, location, fragments=fragments, schema=schema,
                       catalog=catalog, endpoint_url=endpoint_url)
    assert not any(line.rstrip().endswith(";") for s in parts for line in s.splitlines())
    return "".join(f"{s.strip()};\n\n" for s in parts).rstrip("\n") + "\n"


def check_names(schema: str, catalog: str) -> None:
    """Raises ValueError unless Trino's catalog and schema (Athena's database) are plain
    identifiers, which the statements write unquoted."""
    _check_identifier(schema, "schema")
    _check_identifier(catalog, "catalog")


def _check_identifier(name: str, what: str) -> None:
    if not name or not all(c.isalnum() or c == "_" for c in name):
        raise ValueError(f"the {what} name {name!r} must be letters, digits and _ only")


def _duckdb_s3_setup(endpoint_url: str | None) -> list[str]:
    """What a plain DuckDB runs before the views to read the lake on S3: on an
    S3-compatible store, a secret without its endpoint would ask AWS instead."""
    if not endpoint_url:
        return ["For s3://: LOAD httpfs (offline: docs/queries.md, DuckDB without evagg)",
                "  and CREATE SECRET (TYPE s3, KEY_ID '...', SECRET '...', REGION '...') first."]
    parts = urlsplit(endpoint_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the endpoint URL {redacted_endpoint(endpoint_url)!r} needs its "
                         "scheme and host, e.g. http://minio.internal:9000")
    shown = redacted_endpoint(endpoint_url)  # printed text is pasted and shared
    host = urlsplit(shown).netloc
    use_ssl = "false" if parts.scheme == "http" else "true"
    return [f"For s3:// on the store at {shown}, first: LOAD httpfs (offline:",
            "  docs/queries.md, DuckDB without evagg), then",
            "  CREATE SECRET (TYPE s3, KEY_ID '...', SECRET '...', REGION '...',",
            f"  ENDPOINT '{host}', URL_STYLE 'path', USE_SSL {use_ssl})"]


def _header(d: Dialect, lake: Lake, fragments: bool, schema: str, catalog: str,
            endpoint_url: str | None = None) -> str:
    where = {"spark": ["Spark SQL: temporary views, gone with the session. Paste them into",
                       "  spark-sql, or run each with spark.sql(), in order."],
             "duckdb": ["DuckDB: views in the current database. Run them in order."],
             "trino": [f"Trino: external tables in {catalog}.{schema} (a Hive connector "
                       "catalog) and views.", "  Run them in order."],
             "athena": [f"Athena: external tables in the database {schema} and views. Run "
                        "them in order."]}
    lines = [
        f"evagg's events and tasks over the lake {lake.url}, for",
        *where[d.name],
        f"{EVENTS_RAW}: every stored row, with the hive columns date, hour, node.",
        f"{EVENTS}: one row per event (event_id, kind), the earliest received copy.",
        f"{FRAGMENTS}: the task fragments under {TASKS_ROOT}/ (one per node and hour).",
        f"{TASKS}: one row per task attempt, the fragments merged with the raw events of the",
        "  partitions that have none. Without the ends evagg infers for attempts left open",
        "  by a dead process, job or node (evagg query tasks puts those on).",
    ]
    if not fragments:
        lines += [f"The lake had no {TASKS_ROOT}/ when this was printed: {FRAGMENTS} is "
                  "empty and", "  tasks folds every raw event (correct, slower). Print "
                  "these again once it has."]
    if d.name == "spark":
        lines += ["Needs the event files' times as TIMESTAMP(MICROS): Spark refuses the "
                  "nanosecond", "  files agents wrote before that (evagg compact "
                  "--rewrite-types rewrites them)."]
    if d.name == "duckdb" and lake.is_s3:
        lines += _duckdb_s3_setup(endpoint_url)
    if d.name == "trino":
        lines += ["Times read at the catalog's hive.timestamp-precision (MILLISECONDS "
                  "unless set to", "  MICROSECONDS). New partitions appear after the "
                  "sync_partition_metadata calls run again."]
    if d.name == "athena":
        lines += ["Athena reads the times at milliseconds. New partitions appear after "
                  "MSCK REPAIR TABLE", "  runs again (or ALTER TABLE ... ADD PARTITION)."]
    return "".join(f"-- {line}\n" for line in lines)


def _setup(d: Dialect, schema: str, catalog: str) -> list[str]:
    if d.name == "trino":
        return [f"CREATE SCHEMA IF NOT EXISTS {catalog}.{schema}"]
    if d.name == "athena":
        return [f"CREATE DATABASE IF NOT EXISTS {schema}"]
    return []


def _external(d: Dialect, lake: Lake, names: _Names, table: str,
              columns: list[tuple[str, pa.DataType]], under: str, suffix: str) -> list[str]:
    """A table (Spark: a temporary view) over Parquet files in hive partitions, and what
    registers its partitions."""
    name = names.fragments if table == FRAGMENTS else names.events_raw
    column_list = _column_list(d, [*columns, *partitions()])
    where = literal(d, lake.location(d, under))
    if d.name == "spark":
        return [f"CREATE OR REPLACE TEMPORARY VIEW {name} (\n{column_list}\n)\n"
                f"USING parquet\nOPTIONS (path {where}, pathGlobFilter "
                f"{literal(d, '*' + suffix)})"]
    if d.name == "trino":
        keys = ", ".join(f"'{p}'" for p in PARTITION_TYPES)
        return [f"CREATE TABLE IF NOT EXISTS {name} (\n{column_list}\n)\n"
                f"WITH (external_location = {where}, format = 'PARQUET',\n"
                f"      partitioned_by = ARRAY[{keys}])",
                f"CALL {names.catalog}.system.sync_partition_metadata("
                f"schema_name => '{names.schema}', table_name => '{table}', mode => 'FULL')"]
    if d.name == "athena":
        data = _column_list(d, columns)
        keys = ", ".join(f"`{n}` {sql_type('hive', t)}" for n, t in partitions())
        return [f"CREATE EXTERNAL TABLE IF NOT EXISTS {name} (\n{data}\n)\n"
                f"PARTITIONED BY ({keys})\nSTORED AS PARQUET\nLOCATION {where}",
                f"MSCK REPAIR TABLE {name}"]
    raise AssertionError(d.name)


def _duckdb_read(lake: Lake, under: str, glob: str, *, with_file: bool = False) -> str:
    d = dialect("duckdb")
    hive = ", ".join(f"'{n}': {sql_type('duckdb', t)}" for n, t in partitions())
    path = f"{lake.url}/{under}/{glob}" if under else f"{lake.url}/{glob}"
    file = f", filename = '{SOURCE_FILE_COLUMN}'" if with_file else ""
    return (f"read_parquet({literal(d, path)}, hive_partitioning = true, "
            f"union_by_name = true, hive_types = {{{hive}}}{file})")


def _events_raw(d: Dialect, lake: Lake, names: _Names) -> list[str]:
    if d.name == "duckdb":
        # DuckDB 2 reads nanosecond files' times as TIMESTAMPTZ_NS: cut down to
        # microseconds, as DuckDB 1.x reads them and as every file is written now
        cut = ", ".join(f"CAST(date_trunc('microsecond', {c}) AS TIMESTAMPTZ) AS {c}"
                        for c in _timecolumns_of())
        return [f"CREATE OR REPLACE VIEW {names.events_raw} AS\n"
                f"SELECT * REPLACE ({cut})\n"
                f"FROM {_duckdb_read(lake, '', EVENT_GLOB, with_file=True)}"]
    return _external(d, lake, names, EVENTS_RAW, columns_of(EVENT_SCHEMA), "", ".parquet")


def _timecolumns_of() -> list[str]:
    return [f.name for f in EVENT_SCHEMA if pa.types.is_timestamp(f.type)]


def _events(d: Dialect, names: _Names) -> str:
    order = "PARTITION BY event_id, kind ORDER BY received ASC NULLS LAST"
    if d.name == "duckdb":
        return (f"CREATE OR REPLACE VIEW {names.events} AS\n"
                f"SELECT * EXCLUDE ({SOURCE_FILE_COLUMN}) FROM {names.events_raw}\n"
                f"QUALIFY row_number() OVER ({order}) = 1")
    every = [n for n, _ in columns_of(EVENT_SCHEMA)] + list(PARTITION_TYPES)
    select = ", ".join(d.quote(c) for c in every)
    view = "TEMPORARY VIEW" if d.name == "spark" else "VIEW"
    return (f"CREATE OR REPLACE {view} {names.events} AS\n"
            f"SELECT {select}\nFROM (\n    SELECT *, row_number() OVER ({order}) AS evagg_copy\n"
            f"    FROM {names.events_raw}\n) AS copies\nWHERE evagg_copy = 1")


def _fragments(d: Dialect, lake: Lake, names: _Names) -> list[str]:
    if d.name == "duckdb":
        glob = f"date=*/hour=*/node=*/*{FRAGMENT_SUFFIX}"
        return [f"CREATE OR REPLACE VIEW {names.fragments} AS\n"
                f"SELECT * FROM {_duckdb_read(lake, TASKS_ROOT, glob)}"]
    return _external(d, lake, names, FRAGMENTS, columns_of(fragment_schema()),
                     TASKS_ROOT, FRAGMENT_SUFFIX)


def _no_fragments(d: Dialect, names: _Names) -> str:
    engine = "trino" if d.name == "athena" else d.name  # a view: Trino's types
    nulls = ",\n".join(f"    CAST(NULL AS {sql_type(engine, t)}) AS {d.quote(n)}"
                       for n, t in [*columns_of(fragment_schema()), *partitions()])
    view = "TEMPORARY VIEW" if d.name == "spark" else "VIEW"
    return (f"-- no {TASKS_ROOT}/ in the lake yet: no fragments, every partition folds raw\n"
            f"CREATE OR REPLACE {view} {names.fragments} AS\nSELECT\n{nulls}\n"
            f"FROM (SELECT 1 AS nothing) AS none WHERE 1 = 0")


def _tasks(d: Dialect, names: _Names) -> str:
    # A fragment covers its node-hour's merged file, never the part files an agent wrote
    # into the hour after it was merged (a late event, `evagg compact` on an open hour):
    # those rows fold raw beside it.
    same_partition = " AND ".join(f"f.{d.quote(p)} = r.{d.quote(p)}" for p in PARTITION_TYPES)
    fold = ", ".join(f"r.{d.quote(c)}" for c in FOLD_COLUMNS)
    covered = (f"r.evagg_source LIKE '%/{COMPACTED_PREFIX}%'\n"
               f"       AND EXISTS (SELECT 1 FROM {names.fragments} AS f\n"
               f"                   WHERE {same_partition})")
    unfragmented = (f"(SELECT {fold}\n     FROM (SELECT r.*, {d.source_file('r')} AS evagg_source\n"
                    f"           FROM {names.events_raw} AS r) AS r\n"
                    f"     WHERE NOT ({covered})) AS unfragmented")
    raw = partial_select(d, unfragmented, distinct_events=True)
    kept = ", ".join(d.quote(c) for c in fragment_schema().names)
    parts = (f"SELECT {kept} FROM {names.fragments}\nUNION ALL\n"
             f"SELECT * FROM ({_indent(raw)}\n) AS raw_parts")
    merged = merge_select(d, f"(\n{_indent(parts)}\n) AS parts")
    view = "TEMPORARY VIEW" if d.name == "spark" else "VIEW"
    attempts = attempts_select(d, "(" + _indent(merged) + "\n) AS merged")
    return ("-- the task fold of sinks/fragments/task_fold.py: partial rows merged, then the\n"
            "-- columns of dashboard/sql/tasks.sql\n"
            f"CREATE OR REPLACE {view} {names.tasks} AS{attempts}")


def _indent(sql: str) -> str:
    return sql.replace("\n", "\n    ")


__all__ = ["DIALECTS", "DialectName", "Lake", "check_names", "fragment_schema",
           "lake_has_fragments",
           "literal", "script", "sql_type", "statements"]
