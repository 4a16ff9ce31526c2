"""An hour's Parquet files written again as one: one row per event_id (the first seen),
timestamps in microseconds whatever unit each input has, row groups of ROW_GROUP_ROWS.
The hour merge (sinks/parquet/compact.py) calls it on local copies of the inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.parquet.id_dedupe import first_occurrences
from sinks.parquet.writer import open_writer, written_schema

ROW_GROUP_ROWS: Final = 100_000


def merge_files(inputs: list[Path], output: Path, metadata: dict[bytes, bytes]) -> int:
    """Write the rows of `inputs` to `output`, one row per event_id (the first seen),
    timestamps in microseconds (floored) whatever unit each input has."""
    footers = [pq.read_metadata(p) for p in inputs]  # each parsed once, files not held open
    schema = pa.unify_schemas([written_schema(f.schema.to_arrow_schema().remove_metadata())
                               for f in footers])
    keep = (first_occurrences(inputs, footers) if "event_id" in schema.names else None)
    written, start = 0, 0
    pending: list[pa.Table] = []
    with open_writer(output, schema.with_metadata(metadata)) as writer:
        for path, footer in zip(inputs, footers, strict=True):
            table = _conform(_read(path, footer), schema)
            if keep is not None:
                mask, start = keep[start:start + table.num_rows], start + table.num_rows
                if not mask.all():
                    table = table.filter(pa.array(mask))
            pending.append(table)
            written += table.num_rows
            if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
                rows = pa.concat_tables(pending)
                whole = rows.num_rows - rows.num_rows % ROW_GROUP_ROWS
                writer.write_table(rows.slice(0, whole), row_group_size=ROW_GROUP_ROWS)
                pending = [rows.slice(whole)]
        if pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
    return written


def _read(path: Path, footer: pq.FileMetaData, columns: list[str] | None = None) -> pa.Table:
    with pq.ParquetFile(path, metadata=footer) as file:
        return file.read(columns=columns)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns (missing ones null), in its order. A
    nanosecond timestamp is cut down to the schema's microseconds (`safe=False`: the cut
    is the point; intake refuses times before 1970, so truncation is the floor)."""
    have = table.schema
    columns = []
    for f in schema:
        if f.name not in have.names:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        column = table.column(f.name)
        if column.type != f.type:
            column = column.cast(f.type, safe=not pa.types.is_timestamp(f.type))
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema.remove_metadata())
