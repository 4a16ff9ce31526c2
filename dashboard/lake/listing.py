"""The Parquet files of one store, listed the same way for a local directory and S3.

The listing decides what the views read: files in the Hive layout
(`date=YYYY-MM-DD/hour=HH/node=<id>/...`) when there are any, otherwise every Parquet
file without partition columns. Names starting with "." or "_" are writers' temporary
files and are skipped. The fingerprint changes whenever a file appears, goes or changes,
so callers can cache results per fingerprint.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinks.locations import S3_SCHEME
from sinks.parquet.layout import TASKS_ROOT, is_fragment_name

HIVE_KEYS = ("date", "hour", "node")


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str  # what DuckDB or pyarrow opens: a local path or s3://bucket/key
    relative: str  # below the store's root, with "/" separators
    size: int
    stamp: str  # mtime or ETag: anything that changes when the content does

    @property
    def hive(self) -> bool:
        parts = self.relative.split("/")[:-1]
        keys = [p.split("=", 1)[0] for p in parts if "=" in p]
        return keys[-len(HIVE_KEYS):] == list(HIVE_KEYS)


@dataclass(frozen=True, slots=True)
class Listing:
    files: tuple[FileEntry, ...]
    hive: bool  # True when `files` all carry date/hour/node in their path
    ignored: int = 0  # Parquet files outside the Hive layout while others are inside it
    fingerprint: str = field(default="")
    # The task fragments under `_tasks/` (sinks/fragments/): the fold reads them in place
    # of the rows of the compacted files they were made from.
    fragments: tuple[FileEntry, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def make_listing(entries: Iterable[FileEntry]) -> Listing:
    entries = list(entries)
    found = sorted((e for e in entries if _is_data_file(e.relative)), key=lambda e: e.relative)
    hive = [e for e in found if e.hive]
    chosen = hive or found
    fragments = sorted((e for e in entries if _is_fragment(e.relative)),
                       key=lambda e: e.relative)
    digest = hashlib.blake2b(digest_size=12)
    for entry in chosen + fragments:
        digest.update(f"{entry.relative}\0{entry.size}\0{entry.stamp}\n".encode())
    return Listing(tuple(chosen), bool(hive), len(found) - len(chosen), digest.hexdigest(),
                   tuple(fragments))


def _is_fragment(relative: str) -> bool:
    return relative.startswith(f"{TASKS_ROOT}/") and is_fragment_name(relative.rsplit("/", 1)[-1])


def _is_data_file(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def list_local(root: Path) -> Listing:
    """Every Parquet file under `root`; OSError when root is missing or unreadable."""
    entries: list[FileEntry] = []
    root_text = str(root)
    for dirpath, dirnames, filenames in os.walk(root_text, onerror=_raise):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))
                       or (d == TASKS_ROOT and dirpath == root_text)]
        for name in filenames:
            if not name.endswith(".parquet") and not is_fragment_name(name):
                continue
            full = os.path.join(dirpath, name)
            try:
                info = os.stat(full)
            except FileNotFoundError:  # removed by a compaction while we listed
                continue
            relative = os.path.relpath(full, root_text).replace(os.sep, "/")
            entries.append(FileEntry(full, relative, info.st_size, str(info.st_mtime_ns)))
    return make_listing(entries)


def _raise(error: OSError) -> None:
    raise error


def list_s3(client: Any, bucket: str, prefix: str) -> Listing:
    """Every Parquet object under s3://bucket/prefix (boto3 client; its errors propagate)."""
    entries: list[FileEntry] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            key = item["Key"]
            relative = key[len(prefix):].lstrip("/")
            entries.append(FileEntry(f"{S3_SCHEME}{bucket}/{key}", relative, int(item["Size"]),
                                     item.get("ETag", "")))
    return make_listing(entries)
