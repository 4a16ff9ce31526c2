"""Where `evagg query ddl`'s statements point: a lake as each engine names it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sinks.fragments.dialects import Dialect
from sinks.locations import is_s3_url
from sinks.parquet.layout import FRAGMENT_SUFFIX, TASKS_ROOT


@dataclass(frozen=True)
class Lake:
    """Where the statements point: `url` is an absolute local directory or an `s3://`
    prefix, without a trailing slash."""

    url: str

    @staticmethod
    def parse(location: str) -> Lake:
        """A lake from what a user typed: a directory (made absolute) or `s3://bucket/prefix`.
        Raises ValueError for anything else."""
        text = location.strip()
        if not text:
            raise ValueError("the lake is empty: give a directory or s3://bucket/prefix")
        if "://" in text and not is_s3_url(text):
            raise ValueError(f"{location!r} is neither a directory nor an s3:// prefix")
        if is_s3_url(text):
            if not text[len("s3://"):].strip("/"):
                raise ValueError(f"{location!r} names no bucket: give s3://bucket/prefix")
            return Lake(text.rstrip("/"))
        return Lake(str(Path(text).expanduser().resolve()))

    @property
    def is_s3(self) -> bool:
        return is_s3_url(self.url)

    def location(self, d: Dialect, under: str = "") -> str:
        """The lake (or a folder under it) as `d`'s engine names it."""
        url = f"{self.url}/{under}" if under else self.url
        if d.name == "spark":
            # Hadoop's S3 file system is s3a:// (EMR's s3:// works too); a local path as a
            # file: URI, so a cluster whose default file system is HDFS reads it here
            return ("s3a://" + url[len("s3://"):]) if self.is_s3 else f"file://{url}"
        if d.name == "athena":
            return url + "/"  # Athena's LOCATION is a prefix
        return url


def lake_has_fragments(lake: Lake) -> bool | None:
    """Whether a local lake holds task fragments (None for S3: not looked at here)."""
    if lake.is_s3:
        return None
    root = Path(lake.url) / TASKS_ROOT
    return root.is_dir() and next(root.rglob(f"*{FRAGMENT_SUFFIX}"), None) is not None
