"""Files read by pyarrow's filesystem and dataset, registered in DuckDB: a local
directory when asked for, an s3:// prefix when asked for or when httpfs cannot load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import duckdb

from dashboard.lake.listing import FileEntry, Listing
from dashboard.lake.sources._base import Relation, Source, registered_relation


class Where(Protocol):
    """Where the files are, as pyarrow reaches them (a LocalDir or an S3Prefix)."""

    @property
    def cache_key(self) -> str: ...
    @property
    def base(self) -> str: ...  # in the form of arrow_path
    def list(self) -> Listing: ...
    def follow(self) -> bool: ...  # True when the credentials changed
    def filesystem(self) -> Any: ...
    def arrow_path(self, path: str) -> str: ...


class PyarrowSource(Source):
    """pyarrow reads the listed files; a new filesystem when credentials rotate."""

    engine = "pyarrow"

    def __init__(self, where: Where, note: str = "") -> None:
        self.where = where
        self.note = note
        self.fs = where.filesystem()

    @property
    def cache_key(self) -> str:
        return self.where.cache_key

    @property
    def base(self) -> str:
        return self.where.base

    def list(self) -> Listing:
        return self.where.list()

    def follow_credentials(self, con: duckdb.DuckDBPyConnection) -> bool:
        if not self.where.follow():
            return False
        self.fs = self.where.filesystem()
        return True  # a dataset holds the old filesystem: build it again

    def path(self, entry: FileEntry) -> str:
        return self.where.arrow_path(entry.path)

    def relation(self, listing: Listing, name: str) -> Relation:
        return registered_relation(listing, name, self._dataset(listing))

    def fragment_relation(self, fragments: Sequence[FileEntry], name: str) -> Relation:
        import pyarrow.dataset as ds

        dataset = ds.dataset([self.path(f) for f in fragments], format="parquet",
                             filesystem=self.fs)
        return Relation(name, {name: dataset})

    def kv_metadata(self, cursor: duckdb.DuckDBPyConnection, entry: FileEntry,
                    key: str) -> bytes | None:
        import pyarrow.parquet as pq

        with self.fs.open_input_file(self.path(entry)) as handle:
            meta = pq.read_metadata(handle).metadata or {}
        found = meta.get(key.encode())
        return bytes(found) if found is not None else None

    def kv_metadata_of(self, cursor: duckdb.DuckDBPyConnection, entries: Sequence[FileEntry],
                       key: str) -> dict[str, bytes | None]:
        return {e.path: self.kv_metadata(cursor, e, key) for e in entries}

    def _dataset(self, listing: Listing) -> Any:
        """A pyarrow dataset over the listed files, with the event schema (missing
        columns null)."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        from sinks.schema import EVENT_SCHEMA

        hive_schema = pa.schema([("date", pa.date32()), ("hour", pa.int32()),
                                 ("node", pa.string())])
        paths = [self.path(f) for f in listing.files]
        if listing.hive:
            schema = pa.unify_schemas([EVENT_SCHEMA, hive_schema])
            partitioning = ds.partitioning(hive_schema, flavor="hive")
            return ds.dataset(paths, schema=schema, format="parquet", filesystem=self.fs,
                              partitioning=partitioning,
                              partition_base_dir=self.base.rstrip("/"))
        return ds.dataset(paths, schema=EVENT_SCHEMA, format="parquet", filesystem=self.fs)
