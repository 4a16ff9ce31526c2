"""S3 access for the query layer: where the objects are and how DuckDB or pyarrow reach them.

Credentials come from boto3's standard chain (environment, shared files, instance
role). `endpoint_url` (or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) points at an
S3-compatible service; then addressing is path-style. DuckDB reads s3:// through the
httpfs extension that the pip package `duckdb-extension-httpfs` ships (loaded from its
file, so no download); when that cannot load, pyarrow's S3FileSystem does the reading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb


@dataclass(frozen=True, slots=True)
class S3Settings:
    region: str
    endpoint_url: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None

    @staticmethod
    def resolve(endpoint_url: str | None = None, region: str | None = None,
                session: Any = None) -> S3Settings:
        """Settings from boto3's chain; pass the same `session` again to pick up
        credentials it has refreshed (instance roles, SSO) since the last call."""
        import boto3

        session = session or boto3.Session()
        endpoint = (endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL") or None)
        creds = session.get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        return S3Settings(
            region=region or session.region_name or "us-east-1",
            endpoint_url=endpoint,
            access_key=frozen.access_key if frozen else None,
            secret_key=frozen.secret_key if frozen else None,
            session_token=frozen.token if frozen else None,
        )

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        style = {"addressing_style": "path"} if self.endpoint_url else {}
        return boto3.client(
            "s3",
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            aws_session_token=self.session_token,
            config=Config(s3=style, retries={"max_attempts": 3, "mode": "standard"}),
        )


def httpfs_extension_path() -> Path | None:
    """The .duckdb_extension file of the installed duckdb-extension-httpfs, if any."""
    try:
        package = resources.files("duckdb_extension_httpfs")
    except ModuleNotFoundError:
        return None
    folder = Path(str(package)) / "extensions" / f"v{duckdb.__version__}"
    found = sorted(folder.glob("httpfs.duckdb_extension"))
    return found[0] if found else None


def load_httpfs(con: duckdb.DuckDBPyConnection, settings: S3Settings) -> None:
    """Load httpfs and give it the credentials; raises on any failure."""
    load_httpfs_build(con)
    options = [("TYPE", "s3"), ("REGION", sql_literal(settings.region))]
    if settings.access_key and settings.secret_key:
        options += [("KEY_ID", sql_literal(settings.access_key)),
                    ("SECRET", sql_literal(settings.secret_key))]
    if settings.session_token:
        options.append(("SESSION_TOKEN", sql_literal(settings.session_token)))
    if settings.endpoint_url:
        parts = urlsplit(settings.endpoint_url)
        options += [("ENDPOINT", sql_literal(parts.netloc)), ("URL_STYLE", "'path'"),
                    ("USE_SSL", "true" if parts.scheme == "https" else "false")]
    body = ", ".join(f"{key} {value}" for key, value in options)
    # Credentials are not user input from the web, but they are quoted like any literal.
    con.execute(f"CREATE OR REPLACE SECRET evagg_s3 ({body})")


def load_httpfs_build(con: duckdb.DuckDBPyConnection) -> None:
    """Load an httpfs build that matches this DuckDB, or raise RuntimeError saying how to
    install one. The build comes from the pip package duckdb-extension-httpfs when it has
    one for this DuckDB (1.5.5 has; DuckDB 2 has none yet), else from DuckDB's own
    extension folder (`INSTALL httpfs` put it there); nothing is downloaded."""
    path = httpfs_extension_path()
    if path is not None:
        con.execute(f"LOAD {sql_literal(str(path))}")
        return
    try:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("LOAD httpfs")
    except duckdb.Error:
        raise RuntimeError(
            f"no httpfs build for duckdb {duckdb.__version__} is installed (pip install "
            f"duckdb-extension-httpfs=={duckdb.__version__} where it exists, or run "
            "INSTALL httpfs in DuckDB once)") from None


def pyarrow_filesystem(settings: S3Settings) -> Any:
    from pyarrow import fs

    kwargs: dict[str, Any] = {"region": settings.region}
    if settings.access_key and settings.secret_key:
        kwargs.update(access_key=settings.access_key, secret_key=settings.secret_key,
                      session_token=settings.session_token)
    if settings.endpoint_url:
        parts = urlsplit(settings.endpoint_url)
        kwargs.update(endpoint_override=parts.netloc, scheme=parts.scheme or "http",
                      force_virtual_addressing=False)
    return fs.S3FileSystem(**kwargs)


def sql_literal(text: str) -> str:
    """A SQL string literal for configuration text (paths, keys), never for web input."""
    return "'" + text.replace("'", "''") + "'"
