"""How evagg writes a Parquet file: per-column encodings and statistics, in one place for
the sink's files and for `evagg compact`'s merged files (which were written with
pyarrow's defaults until this module: 20% larger than the files they replaced).

Dictionary pages only for columns whose values repeat; ids, times and measurements are
smaller plain or delta-encoded under zstd (47 instead of 64 bytes per event, and faster
to write, in bench/bench_decode_parquet.py). Min/max statistics only for flat columns:
those of map entries and free text (messages, stack traces) prune nothing, and cost a
quarter of the write for Ray's rows, which carry many attrs. DuckDB, Spark and Trino read
all of these.
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


def open_writer(where: Any, schema: pa.Schema, compression: str = "zstd") -> pq.ParquetWriter:
    """A ParquetWriter for `schema` (the event schema, or a compaction's unified one) on
    `where` (a path or an Arrow output stream)."""
    names = set(schema.names)
    return pq.ParquetWriter(
        where,
        schema,
        compression=compression,
        use_dictionary=[c for c in DICTIONARY_COLUMNS if c.split(".", 1)[0] in names],
        column_encoding={c: e for c, e in COLUMN_ENCODINGS.items()
                         if c in names and _encodable(schema.field(c).type, e)},
        write_statistics=[f.name for f in schema if f.name not in NO_STATISTICS],
    )


def _encodable(kind: pa.DataType, encoding: str) -> bool:
    """Whether `encoding` fits the column as it is in this schema (older files may differ)."""
    if encoding == "DELTA_BYTE_ARRAY":
        return bool(pa.types.is_string(kind) or pa.types.is_binary(kind))
    return bool(pa.types.is_integer(kind) or pa.types.is_timestamp(kind))
