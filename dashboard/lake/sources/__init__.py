"""How the store reads its files: one source object per way of reading.

`open_source` picks it: a local directory is read by DuckDB itself (`LocalSource`); an
s3:// prefix by DuckDB's httpfs (`HttpfsSource`) unless pyarrow is asked for, or httpfs
cannot load and the choice was "auto"; pyarrow's filesystem and dataset
(`PyarrowSource`) read either. Each answers what the store asks (`Source`): the cache
key, the listing, rotated credentials, the relation over a batch of files, a file's
key-value metadata. The modules starting with "_" are this package's own.
"""

from __future__ import annotations

import logging

import duckdb

from dashboard.lake.errors import StoreUnavailable
from dashboard.lake.sources._base import Relation, Source, fragments_sql
from dashboard.lake.sources._httpfs import HttpfsSource
from dashboard.lake.sources._local import LocalDir, LocalSource
from dashboard.lake.sources._pyarrow import PyarrowSource
from dashboard.lake.sources._s3 import S3Prefix
from sinks.locations import is_s3_url

__all__ = ["ENGINES", "Relation", "Source", "fragments_sql", "open_source"]
log = logging.getLogger("evagg.dashboard.lake")
ENGINES = ("auto", "httpfs", "pyarrow")


def open_source(location: str, endpoint_url: str | None, region: str | None, engine: str,
                con: duckdb.DuckDBPyConnection) -> Source:
    """The source for `location` and `engine` (one of ENGINES); an httpfs source readies
    `con`. "auto" and "httpfs" read a local directory with DuckDB itself."""
    if not is_s3_url(location):
        local = LocalDir(location)
        return PyarrowSource(local) if engine == "pyarrow" else LocalSource(local)
    prefix = S3Prefix(location, endpoint_url, region)
    if engine == "pyarrow":
        return PyarrowSource(prefix)
    try:
        return HttpfsSource(prefix, con)
    except Exception as exc:  # any load failure falls back to pyarrow
        if engine == "httpfs":
            raise StoreUnavailable(f"the httpfs extension did not load: {exc}") from None
        note = f"httpfs did not load ({exc}); reading with pyarrow"
        log.warning("%s", note)
        return PyarrowSource(prefix, note)
