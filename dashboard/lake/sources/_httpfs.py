"""An s3:// prefix read by DuckDB itself, through the httpfs extension."""

from __future__ import annotations

import duckdb

from dashboard.lake.listing import Listing
from dashboard.lake.s3 import load_httpfs
from dashboard.lake.sources._base import Relation, Source, duckdb_relation
from dashboard.lake.sources._s3 import S3Prefix


class HttpfsSource(Source):
    """DuckDB reads the listed s3:// URLs; its secret follows rotating credentials."""

    engine = "httpfs"

    def __init__(self, where: S3Prefix, con: duckdb.DuckDBPyConnection) -> None:
        load_httpfs(con, where.settings)  # raises on any failure: the caller may fall back
        self.where = where

    @property
    def cache_key(self) -> str:
        return self.where.cache_key

    @property
    def base(self) -> str:
        return self.where.url

    def list(self) -> Listing:
        return self.where.list()

    def follow_credentials(self, con: duckdb.DuckDBPyConnection) -> bool:
        if self.where.follow():
            load_httpfs(con, self.where.settings)  # the secret is replaced in place
        return False

    def relation(self, listing: Listing, name: str) -> Relation:
        return duckdb_relation(listing)
