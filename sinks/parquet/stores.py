"""Where finished Parquet files go: a local directory here; S3 lives in `sinks.parquet.s3`.

A store hands out a local staging path for a key, and later makes the finished file
visible under that key in one step, so a reader never sees half a file. Keys use "/" as
the separator (they become object keys on S3 and relative paths here).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from sinks.base import SinkCounter
from sinks.durable import publish_file

STAGING_PREFIX: Final = ".evagg-"
STAGING_SUFFIX: Final = ".tmp"


def staging_name(key: str) -> str:
    """A hidden name: DuckDB's `*.parquet` globs and Hive/Spark listings skip it."""
    return f"{STAGING_PREFIX}{key.rsplit('/', 1)[-1]}{STAGING_SUFFIX}"


def is_staging_name(name: str) -> bool:
    return name.startswith(STAGING_PREFIX) and name.endswith(STAGING_SUFFIX)



class StoreError(Exception):
    """A failed store operation, classified for the delivery loop.

    `kind` is a bounded label (metrics use it); `permanent` means retrying soon will not
    help (bad credentials, missing bucket): the loop then retries slowly and
    `evagg_sink_permanent_error` shows 1. The message names the operation and the object,
    never a credential.
    """

    def __init__(self, message: str, kind: str, permanent: bool = False,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.permanent = permanent
        self.retry_after_s = retry_after_s


class ObjectStore(abc.ABC):
    """The four things the Parquet sink asks of a destination."""

    @abc.abstractmethod
    def staging_path(self, key: str) -> Path:
        """A local path to write the file for `key` to (its directory exists)."""

    @abc.abstractmethod
    async def publish(self, staged: Path, key: str) -> None:
        """Make `staged` visible under `key` in one step, replacing any older object.

        Raises on failure; the staged file is then still there for the caller to delete.
        """

    @abc.abstractmethod
    def describe(self) -> str:
        """Where files go, for logs and `evagg status` (never a secret)."""

    @abc.abstractmethod
    def cleanup_staging(self) -> int:
        """Delete staging files a crashed run left behind; returns how many."""

    def counters(self) -> Sequence[SinkCounter]:
        """The store's own counts, exported with its sink's (names in docs/metrics.md)."""
        return ()


class LocalStore(ObjectStore):
    """A directory tree. Staged files sit next to their final path (same filesystem), so
    publishing is fsync, rename, fsync of the directory: after a crash a key holds either
    the old complete file or the new complete file, never a torn one."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def final_path(self, key: str) -> Path:
        parts = [part for part in key.split("/") if part]
        if not parts or any(part in (".", "..") for part in parts):
            raise ValueError(f"unsafe object key {key!r}")
        return self.root.joinpath(*parts)

    def staging_path(self, key: str) -> Path:
        final = self.final_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.with_name(staging_name(key))

    async def publish(self, staged: Path, key: str) -> None:
        await asyncio.to_thread(self._publish, staged, self.final_path(key))

    def _publish(self, staged: Path, final: Path) -> None:
        publish_file(staged, final, synced_up_to=self.root)

    def describe(self) -> str:
        return f"local:{self.root}"

    def cleanup_staging(self) -> int:
        """Delete every staging file under the root.

        A staging file of a live writer (another agent sharing this root) costs that
        writer one retry at most: its publish fails on the missing file and the sink
        rewrites the same key from the spool.
        """
        if not self.root.is_dir():
            return 0
        removed = 0
        for directory, _, files in os.walk(self.root):
            for name in files:
                if is_staging_name(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))
                        removed += 1
        return removed
