"""The relation behind `events_raw`: SQL text over an exact list of Parquet files.

DuckDB reads the list itself (local paths or s3:// through httpfs), or reads a pyarrow
dataset registered under a name. Both yield the event columns plus the Hive partition
columns date (DATE), hour (INTEGER) and node (VARCHAR); files outside the Hive layout
get NULL there.
"""

from __future__ import annotations

from typing import Any

from dashboard.listing import Listing
from dashboard.s3 import sql_literal

_HIVE_TYPES = "{'date': DATE, 'hour': INTEGER, 'node': VARCHAR}"
_NULL_HIVE = ("CAST(NULL AS DATE) AS date, CAST(NULL AS INTEGER) AS hour, "
              "CAST(NULL AS VARCHAR) AS node")


def parquet_source(listing: Listing, registered: str | None) -> str:
    """SQL for the rows of every listed file; `registered` names a pyarrow dataset."""
    if registered is not None:
        relation = registered
        if listing.hive:
            return relation
        return f"(SELECT *, {_NULL_HIVE} FROM {relation})"
    files = ", ".join(sql_literal(f.path) for f in listing.files)
    if listing.hive:
        return (f"read_parquet([{files}], hive_partitioning = true, union_by_name = true, "
                f"hive_types = {_HIVE_TYPES})")
    return (f"(SELECT *, {_NULL_HIVE} FROM read_parquet([{files}], "
            f"hive_partitioning = false, union_by_name = true))")


def arrow_dataset(listing: Listing, filesystem: Any, base_dir: str, s3: bool) -> Any:
    """A pyarrow dataset over the listed files, with the event schema (missing columns null)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from sinks.schema import EVENT_SCHEMA

    hive_schema = pa.schema([("date", pa.date32()), ("hour", pa.int32()), ("node", pa.string())])

    paths = [f.path[5:] if s3 else f.path for f in listing.files]  # S3FileSystem: bucket/key
    if listing.hive:
        schema = pa.unify_schemas([EVENT_SCHEMA, hive_schema])
        partitioning = ds.partitioning(hive_schema, flavor="hive")
        return ds.dataset(paths, schema=schema, format="parquet", filesystem=filesystem,
                          partitioning=partitioning, partition_base_dir=base_dir.rstrip("/"))
    return ds.dataset(paths, schema=EVENT_SCHEMA, format="parquet", filesystem=filesystem)
