"""Whether DuckDB's httpfs loads here: DuckDB 2.0 has no pip-installable build yet, so
there the S3 tests run through the pyarrow reader alone and the httpfs ones are skipped,
saying why."""

from __future__ import annotations

import duckdb
import pytest

import dashboard.lake.s3


def httpfs_missing() -> str:
    """Why no httpfs build loads into this DuckDB ("" when one does)."""
    try:
        dashboard.lake.s3.load_httpfs_build(duckdb.connect())
    except RuntimeError as exc:
        return str(exc)
    return ""


NO_HTTPFS = httpfs_missing()
needs_httpfs = pytest.mark.skipif(bool(NO_HTTPFS), reason=f"httpfs: {NO_HTTPFS}")
