"""The column types of `evagg query ddl`'s statements: Arrow types in each engine's DDL,
read off their owners (the event schema, and the fold's own output for the fragments)."""

from __future__ import annotations

import functools
from typing import Final

import pyarrow as pa

from sinks.fragments.dialects import Dialect, dialect
from sinks.fragments.task_fold import FOLD_COLUMNS, partial_select

# The hive columns of the `date=/hour=/node=` directories, typed as evagg's own reader
# types them (dashboard's read_parquet hive_types).
PARTITION_TYPES: Final[dict[str, pa.DataType]] = {
    "date": pa.date32(), "hour": pa.int32(), "node": pa.string()}


@functools.cache
def fragment_schema() -> pa.Schema:
    """The columns of a task fragment: the partial fold's output, as DuckDB writes it."""
    import duckdb

    con = duckdb.connect()
    try:
        empty = ", ".join(f"CAST(NULL AS {kind}) AS {name}"
                          for name, kind in FOLD_COLUMNS.items())
        con.execute(f"CREATE TEMP TABLE no_rows AS SELECT {empty} WHERE false")
        table = con.sql(partial_select(dialect("duckdb"), "no_rows")).to_arrow_table()
        return table.schema
    finally:
        con.close()


def sql_type(engine: str, kind: pa.DataType) -> str:
    """An Arrow type in `engine`'s DDL: duckdb, spark, trino, or hive (Athena's tables)."""
    if pa.types.is_struct(kind):
        fields = [(kind.field(i).name, sql_type(engine, kind.field(i).type))
                  for i in range(kind.num_fields)]
        if engine == "spark":
            return "STRUCT<" + ", ".join(f"{n}: {t}" for n, t in fields) + ">"
        if engine == "hive":
            return "struct<" + ",".join(f"{n}:{t}" for n, t in fields) + ">"
        inner = ", ".join(f"{n} {t}" for n, t in fields)
        return f"row({inner})" if engine == "trino" else f"STRUCT({inner})"
    if pa.types.is_map(kind):
        key, item = sql_type(engine, kind.key_type), sql_type(engine, kind.item_type)
        if engine in ("spark", "hive"):
            return f"{'MAP' if engine == 'spark' else 'map'}<{key}, {item}>"
        return f"map({key}, {item})" if engine == "trino" else f"MAP({key}, {item})"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = sql_type(engine, kind.value_type)
        if engine in ("spark", "hive"):
            return f"{'ARRAY' if engine == 'spark' else 'array'}<{item}>"
        return f"array({item})" if engine == "trino" else f"{item}[]"
    names = _SCALARS[engine]
    for test, name in zip(_SCALAR_TESTS, names, strict=True):
        if test(kind):
            return name
    raise ValueError(f"no {engine} type for Arrow type {kind}")


_SCALAR_TESTS: Final = (pa.types.is_string, pa.types.is_large_string, pa.types.is_int32,
                        pa.types.is_int64, pa.types.is_float64, pa.types.is_boolean,
                        pa.types.is_timestamp, pa.types.is_date32)
_SCALARS: Final = {
    "duckdb": ("VARCHAR", "VARCHAR", "INTEGER", "BIGINT", "DOUBLE", "BOOLEAN", "TIMESTAMPTZ",
               "DATE"),
    "spark": ("STRING", "STRING", "INT", "BIGINT", "DOUBLE", "BOOLEAN", "TIMESTAMP", "DATE"),
    # the Hive connector takes `timestamp` alone, at its hive.timestamp-precision
    "trino": ("varchar", "varchar", "integer", "bigint", "double", "boolean", "timestamp",
              "date"),
    "hive": ("string", "string", "int", "bigint", "double", "boolean", "timestamp", "date"),
}


def table_engine(d: Dialect) -> str:
    return "hive" if d.name == "athena" else d.name


def columns_of(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    return [(f.name, f.type) for f in schema]


def partitions() -> list[tuple[str, pa.DataType]]:
    return list(PARTITION_TYPES.items())
