"""The Arrow schema of an event row: the one place where column types are decided.

Spool records hold Arrow IPC record-batch messages of exactly this schema (no schema
message per record), so the schema version is part of the spool format.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from emitters.fields import EVENT_FIELDS

SCHEMA_VERSION: Final = 1

_TYPES: Final[dict[str, pa.DataType]] = {
    "string": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "timestamp_ns": pa.timestamp("ns", tz="UTC"),
    "map_string_float64": pa.map_(pa.string(), pa.float64()),
    "map_string_string": pa.map_(pa.string(), pa.string()),
    "list_string": pa.list_(pa.string()),
}

EVENT_SCHEMA: Final[pa.Schema] = pa.schema(
    [pa.field(name, _TYPES[kind]) for name, kind in EVENT_FIELDS.items()]
)
COLUMN_NAMES: Final[tuple[str, ...]] = tuple(EVENT_FIELDS)


def empty_batch() -> pa.RecordBatch:
    # from typed empty arrays: from_pylist (and from_arrays with a schema) would import
    # pandas where it is installed, 30 MiB the agent keeps out (aggregator/memory.py)
    return pa.record_batch([pa.nulls(0, f.type) for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)


def batch_to_bytes(batch: pa.RecordBatch) -> bytes:
    """Serialize one record batch (without its schema) for a spool record."""
    return bytes(batch.serialize().to_pybytes())


def batch_from_bytes(payload: bytes) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(payload), EVENT_SCHEMA)
