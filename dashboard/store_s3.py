"""The store's S3 side: one s3:// prefix, opened for DuckDB's httpfs or for pyarrow.

Opening picks the engine (httpfs unless pyarrow is asked for; pyarrow when httpfs
cannot load and the choice was "auto"). Before each listing the reader follows
rotating credentials, and it turns S3 errors into the dashboard's own errors.
The building blocks (location, settings, httpfs, pyarrow filesystem) are dashboard/s3.py.
"""

from __future__ import annotations

import logging
from typing import Any

import duckdb

from dashboard.errors import BadInput, NotFound, StoreUnavailable
from dashboard.listing import Listing, list_s3
from dashboard.s3 import S3Settings, load_httpfs, pyarrow_filesystem
from sinks.locations import S3Location

log = logging.getLogger(__name__)


class S3Reader:
    """Credentials, client and (for pyarrow) filesystem for one s3:// prefix."""

    def __init__(self, location: str, endpoint_url: str | None, region: str | None) -> None:
        try:
            self.location = S3Location.parse(location)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        try:
            import boto3

            self._session = boto3.Session()
        except ImportError:
            raise StoreUnavailable("reading s3:// needs boto3: pip install 'evagg[s3]'") from None
        self._endpoint_url = endpoint_url
        self._region = region
        self.settings = S3Settings.resolve(endpoint_url, region, self._session)
        self.client: Any = self.settings.client()
        self.fs: Any = None  # pyarrow's S3FileSystem when the engine is "pyarrow"
        self.engine = ""
        self.note = ""

    @property
    def cache_key(self) -> str:
        """What names the data: the same key opens the same cache file."""
        return f"{self.location.url} {self.settings.endpoint_url or ''}".strip()

    def open(self, con: duckdb.DuckDBPyConnection, engine: str) -> str:
        """Ready `con` (httpfs) or a pyarrow filesystem for `engine`; returns the one used."""
        if engine != "pyarrow":
            try:
                load_httpfs(con, self.settings)
                self.engine = "httpfs"
                return self.engine
            except Exception as exc:  # any load failure falls back to pyarrow
                if engine == "httpfs":
                    raise StoreUnavailable(f"the httpfs extension did not load: {exc}") from None
                self.note = f"httpfs did not load ({exc}); reading with pyarrow"
                log.warning("%s", self.note)
        self.fs = pyarrow_filesystem(self.settings)
        self.engine = "pyarrow"
        return self.engine

    def follow_credentials(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Temporary credentials rotate: hand the new ones to boto3, DuckDB and pyarrow.
        True when `fs` was replaced (a dataset built over the old one must be rebuilt)."""
        fresh = S3Settings.resolve(self._endpoint_url, self._region, self._session)
        if fresh == self.settings:
            return False
        self.settings = fresh
        self.client = fresh.client()
        if self.engine == "httpfs":
            load_httpfs(con, fresh)
            return False
        self.fs = pyarrow_filesystem(fresh)
        return True

    def list(self) -> Listing:
        try:
            return list_s3(self.client, self.location.bucket, self.location.prefix)
        except Exception as exc:
            raise _s3_error(exc, self.location) from None


def _s3_error(exc: Exception, where: S3Location) -> Exception:
    code = ""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    if code in ("NoSuchBucket", "404"):
        return NotFound(f"bucket {where.bucket} does not exist")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return StoreUnavailable(f"access to {where.url} denied ({code})")
    return StoreUnavailable(f"cannot list {where.url}: {type(exc).__name__}: {exc}")
