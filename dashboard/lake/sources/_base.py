"""What every source object answers, and the relation behind `events_raw`.

A relation is SQL text over an exact list of Parquet files: DuckDB reads the list itself
(local paths or s3:// through httpfs), or reads a pyarrow dataset registered under a
name. Both yield the event columns plus the Hive partition columns date (DATE), hour
(INTEGER) and node (VARCHAR); files outside the Hive layout get NULL there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from dashboard.lake.listing import FileEntry, Listing
from dashboard.lake.s3 import sql_literal

_HIVE_TYPES = "{'date': DATE, 'hour': INTEGER, 'node': VARCHAR}"
_NULL_HIVE = ("CAST(NULL AS DATE) AS date, CAST(NULL AS INTEGER) AS hour, "
              "CAST(NULL AS VARCHAR) AS node")


@dataclass(frozen=True, slots=True)
class Relation:
    """The rows of a batch of files: SQL for DuckDB, and the pyarrow datasets it names.
    Registrations are per cursor: every cursor that runs `sql` must `register` first."""

    sql: str
    tables: Mapping[str, Any] = field(default_factory=dict)

    def register(self, cursor: duckdb.DuckDBPyConnection) -> None:
        for name, table in self.tables.items():
            cursor.register(name, table)


class Source(ABC):
    """One way of reading one store's files; the store asks it everything that depends
    on where the files are and on who reads them."""

    engine: str  # "local", "httpfs" or "pyarrow": who reads, as the store describes it
    note: str = ""  # for the user: a fallback that was taken
    # Whether the task fold reads fragments where they are (`fragments_sql`) on every
    # query instead of copying them into its cache: cheap on a local disk, a download of
    # every fragment per query on S3.
    fragments_in_place: bool = False

    @property
    @abstractmethod
    def cache_key(self) -> str:
        """What names the data: the same key opens the same task cache file."""

    @property
    @abstractmethod
    def base(self) -> str:
        """Where the files' relative paths start, in the form `path` gives."""

    @abstractmethod
    def list(self) -> Listing:
        """The store's Parquet files now (the dashboard's own errors when it cannot)."""

    def follow_credentials(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Hand rotated credentials to the reader before a listing. True when relations
        built before hold the old ones and must be built again."""
        return False

    @abstractmethod
    def relation(self, listing: Listing, name: str) -> Relation:
        """The rows of the listed files; `name` is what a registered dataset is called."""

    def fragment_relation(self, fragments: Sequence[FileEntry], name: str) -> Relation:
        """The rows of task fragment files (sinks/fragments/), as they are written."""
        return Relation(fragments_sql([self.path(f) for f in fragments]))

    def path(self, entry: FileEntry) -> str:
        """The path of a listed file in the form this source's reader opens."""
        return entry.path

    def kv_metadata(self, cursor: duckdb.DuckDBPyConnection, entry: FileEntry,
                    key: str) -> bytes | None:
        """One key of a file's Parquet key-value metadata (its footer), None when absent.
        Raises OSError or duckdb.Error when the file cannot be read."""
        found = cursor.execute(
            "SELECT value FROM parquet_kv_metadata($path) WHERE key = CAST($key AS BLOB)",
            {"path": self.path(entry), "key": key}).fetchone()
        return bytes(found[0]) if found else None

    def kv_metadata_of(self, cursor: duckdb.DuckDBPyConnection, entries: Sequence[FileEntry],
                       key: str) -> dict[str, bytes | None]:
        """kv_metadata of many files, by path: DuckDB reads the footers in one statement
        (192 statements, one per compacted file of a day, cost 0.1 s of a first open).
        Raises OSError or duckdb.Error when one cannot be read."""
        paths = {self.path(e): e.path for e in entries}
        found: dict[str, bytes | None] = dict.fromkeys(paths.values())
        if not paths:
            return found
        for name, value in cursor.execute(
                "SELECT file_name, value FROM parquet_kv_metadata($paths) "
                "WHERE key = CAST($key AS BLOB)", {"paths": list(paths), "key": key}).fetchall():
            if name not in paths:  # named otherwise than asked: ask file by file
                return {e.path: self.kv_metadata(cursor, e, key) for e in entries}
            found[paths[name]] = bytes(value)
        return found


def fragments_sql(paths: Sequence[str]) -> str:
    """DuckDB's read of task fragment files, by the paths it opens."""
    files = ", ".join(sql_literal(p) for p in paths)
    return f"read_parquet([{files}], hive_partitioning = false)"


def duckdb_relation(listing: Listing) -> Relation:
    """DuckDB reads every listed file itself (local paths, or s3:// through httpfs)."""
    files = ", ".join(sql_literal(f.path) for f in listing.files)
    if listing.hive:
        return Relation(f"read_parquet([{files}], hive_partitioning = true, "
                        f"union_by_name = true, hive_types = {_HIVE_TYPES})")
    return Relation(f"(SELECT *, {_NULL_HIVE} FROM read_parquet([{files}], "
                    f"hive_partitioning = false, union_by_name = true))")


def registered_relation(listing: Listing, name: str, dataset: Any) -> Relation:
    """DuckDB reads a pyarrow dataset registered under `name`."""
    if listing.hive:
        return Relation(name, {name: dataset})
    return Relation(f"(SELECT *, {_NULL_HIVE} FROM {name})", {name: dataset})
