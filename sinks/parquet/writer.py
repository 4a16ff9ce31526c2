"""How evagg writes a Parquet file: per-column encodings and statistics, in one place for
the sink's files and for `evagg compact`'s merged files (which were written with
pyarrow's defaults until this module: 20% larger than the files they replaced).

Dictionary pages only for columns whose values repeat; ids, times and measurements are
smaller plain or delta-encoded under zstd (47 instead of 64 bytes per event, and faster
to write, in bench/bench_decode_parquet.py). Min/max statistics only for flat columns:
those of map entries and free text (messages, stack traces) prune nothing, and cost a
quarter of the write for Ray's rows, which carry many attrs. DuckDB, Spark and Trino read
all of these.

Timestamps are written as TIMESTAMP(MICROS, UTC), cut down (floored: intake refuses times
before 1970, so dropping the last three digits is the floor) from the nanoseconds the
spool and Arrow hold in memory: Spark 4 and pyiceberg refuse Parquet nanoseconds, and
Trino's and Athena's Hive tables read them at milliseconds. Files written before this are
nanoseconds; every evagg reader takes both (dashboard/lake/views.py `micros`), and
`evagg compact --rewrite-types` rewrites them (`has_nanosecond_times`).
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

# fmt: off
DICTIONARY_COLUMNS: Final = (
    "kind", "source", "name", "state", "job_id", "run_id", "node_id", "worker_id", "actor_id",
    "host", "pid", "uid", "attempt", "error_type", "error_message", "received",
    "metrics.key_value.key", "attrs.key_value.key", "attrs.key_value.value",
    "nonfinite.list.element",
)
# fmt: on
COLUMN_ENCODINGS: Final = {
    "time": "DELTA_BINARY_PACKED",
    "step": "DELTA_BINARY_PACKED",
    "event_id": "DELTA_BYTE_ARRAY",  # UUIDv7: neighbours share their leading time digits
}
NO_STATISTICS: Final = frozenset({"metrics", "attrs", "nonfinite", "error_message",
                                  "stack_trace"})
TIMESTAMP_UNIT: Final = "us"  # of every timestamp column evagg writes to Parquet


def open_writer(where: Any, schema: pa.Schema, compression: str = "zstd") -> pq.ParquetWriter:
    """A ParquetWriter for `schema` (the event schema, or a compaction's unified one) on
    `where` (a path or an Arrow output stream). It takes tables of `schema` and writes
    their timestamps as microseconds, cut down."""
    names = set(schema.names)
    return pq.ParquetWriter(
        where,
        schema,
        compression=compression,
        coerce_timestamps=TIMESTAMP_UNIT,
        allow_truncated_timestamps=True,
        use_dictionary=[c for c in DICTIONARY_COLUMNS if c.split(".", 1)[0] in names],
        column_encoding={c: e for c, e in COLUMN_ENCODINGS.items()
                         if c in names and _encodable(schema.field(c).type, e)},
        write_statistics=[f.name for f in schema if f.name not in NO_STATISTICS],
    )


def written_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` with the types its columns have once written: timestamps in microseconds."""
    return pa.schema([f.with_type(_written_type(f.type)) for f in schema],
                     metadata=schema.metadata)


def _written_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(kind) and kind.unit == "ns":
        return pa.timestamp(TIMESTAMP_UNIT, tz=kind.tz)
    return kind


def has_nanosecond_times(schema: pa.Schema) -> bool:
    """Whether a file's schema holds a nanosecond timestamp (as files written before
    microseconds do), which `evagg compact --rewrite-types` rewrites."""
    return any(pa.types.is_timestamp(f.type) and f.type.unit == "ns" for f in schema)


def _encodable(kind: pa.DataType, encoding: str) -> bool:
    """Whether `encoding` fits the column as it is in this schema (older files may differ)."""
    if encoding == "DELTA_BYTE_ARRAY":
        return bool(pa.types.is_string(kind) or pa.types.is_binary(kind))
    return bool(pa.types.is_integer(kind) or pa.types.is_timestamp(kind))
