"""A local directory of Parquet files, read by DuckDB itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dashboard.lake.errors import BadInput, NotFound, StoreUnavailable
from dashboard.lake.listing import Listing, list_local
from dashboard.lake.sources._base import Relation, Source, duckdb_relation
from sinks.locations import no_such_lake


class LocalDir:
    """Where a local store is: its directory, listed with os.walk."""

    def __init__(self, location: str) -> None:
        root = Path(location).expanduser()
        if not root.exists():
            raise NotFound(no_such_lake(location))
        if not root.is_dir():
            raise BadInput(f"{location} is not a directory")
        self.location = location
        self.root = root

    @property
    def cache_key(self) -> str:
        return str(self.root.resolve())

    @property
    def base(self) -> str:
        return str(self.root)

    def list(self) -> Listing:
        try:
            return list_local(self.root)
        except FileNotFoundError:
            raise NotFound(no_such_lake(self.location)) from None
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {self.location}: {exc.strerror}") from None

    def follow(self) -> bool:
        return False  # no credentials

    def filesystem(self) -> Any:
        from pyarrow import fs

        return fs.LocalFileSystem()

    def arrow_path(self, path: str) -> str:
        return path


class LocalSource(Source):
    """DuckDB reads the listed local files."""

    engine = "local"
    fragments_in_place = True

    def __init__(self, where: LocalDir) -> None:
        self.where = where

    @property
    def cache_key(self) -> str:
        return self.where.cache_key

    @property
    def base(self) -> str:
        return self.where.base

    def list(self) -> Listing:
        return self.where.list()

    def relation(self, listing: Listing, name: str) -> Relation:
        return duckdb_relation(listing)
