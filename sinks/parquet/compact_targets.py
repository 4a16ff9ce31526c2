"""Where `evagg compact` works: a Parquet tree on a local filesystem or under s3://.

A target lists a tree's files (key relative to its root, size, modification time), reads
a file's Parquet key-value metadata and Arrow schema, gives a local path to read an input from and a
scratch path to write the merged file to, publishes that file in one step, and deletes
keys. The compaction procedure (`sinks.parquet.compact`) sees only this `Target` protocol.

There are two because the steps differ in kind, not in detail. `LocalTarget` reads files
in place and publishes by fsync plus an atomic rename beside the final file. `S3Target`
reads a footer with two ranged GETs, downloads inputs to scratch, publishes with one
PutObject (multipart when large) and deletes in batches of 1000.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.disk_room import merge_margin
from sinks.durable import publish_file
from sinks.locations import no_such_lake
from sinks.parquet.s3 import S3Store
from sinks.parquet.stores import staging_name

SCRATCH_PREFIX = "evagg-merge-"
# in this process's scratch folders' names: one without it in a staging directory was
# left by an earlier process (killed mid-merge), since one agent at a time owns a state_dir
_THIS_PROCESS = uuid.uuid4().hex[:12]


def remove_leftover_scratch(staging_dir: Path) -> int:
    """Delete the merge scratch folders earlier processes left in `staging_dir` (each
    as large as the hour it merged); this process's own are kept. Returns how many."""
    if not staging_dir.is_dir():
        return 0
    mine = f"{SCRATCH_PREFIX}{_THIS_PROCESS}-"
    left = [p for p in staging_dir.iterdir()
            if p.name.startswith(SCRATCH_PREFIX) and not p.name.startswith(mine) and p.is_dir()]
    for folder in left:
        shutil.rmtree(folder, ignore_errors=True)
    return len(left)


@dataclass(frozen=True, slots=True)
class FileEntry:
    key: str  # relative to the target's root, "/"-separated
    size: int
    modified: float  # epoch seconds

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]


class Target(Protocol):
    def describe(self) -> str: ...
    def files(self, prefix: str) -> Iterator[FileEntry]: ...
    def kv_metadata(self, key: str) -> dict[bytes, bytes]: ...
    def arrow_schema(self, key: str) -> pa.Schema: ...
    def scratch(self, prefix: str) -> AbstractContextManager[str]: ...
    def make_room_for(self, inputs: int) -> None: ...
    def spill_folder(self) -> AbstractContextManager[str]: ...
    def local_copy(self, key: str, scratch: Path) -> Path: ...
    def scratch_path(self, key: str, scratch: Path) -> Path: ...
    def publish(self, local: Path, key: str) -> None: ...
    def delete(self, keys: list[str]) -> None: ...


class NoRoomForMerge(OSError):
    """A merge would leave its disk with less than its margin free (sinks/disk_room.py):
    not started (counted as compaction_failures{reason="no_room"})."""


def check_room(directory: Path, needed: int) -> None:
    """Raise NoRoomForMerge unless the disk of `directory` has `needed` bytes free and
    the merge's margin more: a merge must not fill the disk the spool writes to."""
    free, margin = shutil.disk_usage(directory).free, merge_margin(directory)
    if free < needed + margin:
        raise NoRoomForMerge(f"not merged: it needs {_mib(needed)} MiB in {directory}, "
                             f"and {_mib(margin)} MiB more left for the spool and the sinks' "
                             f"files; the disk has {_mib(free)} MiB free: give it room")


def spill_room(directory: Path) -> int:
    """How much a merge's fold may write to `directory`'s disk: what is free less the
    merge's margin, so that the spool beside it keeps its room."""
    return shutil.disk_usage(directory).free - merge_margin(directory)


def spill_folder(staging_dir: Path) -> AbstractContextManager[str]:
    """A folder of this process's in `staging_dir` for what a merge's fold spills, gone
    when the fold is done; one a killed process left is swept as its other scratch is."""
    staging_dir.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{_THIS_PROCESS}-spill-",
                                       dir=staging_dir)


def _mib(size: int) -> int:
    return -(-size // 2**20)


class LocalTarget:
    def __init__(self, root: Path, staging_dir: Path | None = None) -> None:
        if not root.exists():
            raise ValueError(no_such_lake(str(root)))
        if not root.is_dir():
            raise ValueError(f"{root} is not a directory")
        self.root = root
        # not the lake (no engine should meet a fold's spill there): the agent's state
        # directory, else the system's temporary one
        self.staging_dir = staging_dir or Path(tempfile.gettempdir())

    def describe(self) -> str:
        return str(self.root)

    def files(self, prefix: str) -> Iterator[FileEntry]:
        for directory, _, names in os.walk(self.root / prefix):
            relative = Path(directory).relative_to(self.root).as_posix()
            for name in names:
                stat = os.stat(os.path.join(directory, name))
                yield FileEntry(f"{relative}/{name}", stat.st_size, stat.st_mtime)

    def kv_metadata(self, key: str) -> dict[bytes, bytes]:
        return dict(pq.read_metadata(self.root / key).metadata or {})

    def arrow_schema(self, key: str) -> pa.Schema:
        return pq.read_schema(self.root / key)

    def scratch(self, prefix: str) -> AbstractContextManager[str]:
        """None needed: inputs are read in place and outputs written beside their files."""
        return contextlib.nullcontext(str(self.root))

    def make_room_for(self, inputs: int) -> None:
        """The merged file is written beside its inputs: about as large again."""
        check_room(self.root, inputs)

    def spill_folder(self) -> AbstractContextManager[str]:
        return spill_folder(self.staging_dir)

    def local_copy(self, key: str, scratch: Path) -> Path:
        return self.root / key

    def scratch_path(self, key: str, scratch: Path) -> Path:
        """Beside the final file (same filesystem, so the rename is atomic), hidden."""
        return (self.root / key).with_name(staging_name(key))

    def publish(self, local: Path, key: str) -> None:
        publish_file(local, self.root / key)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            (self.root / key).unlink(missing_ok=True)


class S3Target:
    """Lists, reads footers, downloads, uploads and deletes through an S3Store's client."""

    def __init__(self, store: S3Store) -> None:
        self.store = store

    def describe(self) -> str:
        return self.store.describe()

    def files(self, prefix: str) -> Iterator[FileEntry]:
        full = self.store.full_key(prefix)
        with self.store.classified("ListObjectsV2", full):
            pages = self.store.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.store.bucket, Prefix=full)
            for page in pages:
                for item in page.get("Contents", []):
                    yield FileEntry(item["Key"][len(self.store.prefix):], int(item["Size"]),
                                    item["LastModified"].timestamp())

    def kv_metadata(self, key: str) -> dict[bytes, bytes]:
        return dict(self._footer(key).metadata or {})

    def arrow_schema(self, key: str) -> pa.Schema:
        return self._footer(key).schema.to_arrow_schema()

    def _footer(self, key: str) -> pq.FileMetaData:
        """Two ranged GETs: the 8-byte trailer, then the footer it announces."""
        length = int.from_bytes(self._tail(key, 8)[:4], "little")
        footer = self._tail(key, length + 8)
        return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))

    def _tail(self, key: str, length: int) -> bytes:
        full = self.store.full_key(key)
        with self.store.classified("GetObject", full):
            answer = self.store.client.get_object(Bucket=self.store.bucket, Key=full,
                                                  Range=f"bytes=-{length}")
            return bytes(answer["Body"].read())

    def make_room_for(self, inputs: int) -> None:
        """The inputs are downloaded and the merged file written beside them: twice."""
        self.store.staging_dir.mkdir(parents=True, exist_ok=True)
        check_room(self.store.staging_dir, 2 * inputs)

    def scratch(self, prefix: str) -> AbstractContextManager[str]:
        """A folder in the store's staging directory for a partition's downloaded inputs
        and its merged file: as large as the partition, so on the disk the caller chose
        (the agent's state directory), not in a small /tmp."""
        self.store.staging_dir.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{_THIS_PROCESS}-{prefix}",
                                           dir=self.store.staging_dir)

    def spill_folder(self) -> AbstractContextManager[str]:
        return spill_folder(self.store.staging_dir)

    def local_copy(self, key: str, scratch: Path) -> Path:
        local = scratch / f"input-{hashlib.sha256(key.encode()).hexdigest()[:16]}.parquet"
        full = self.store.full_key(key)
        with self.store.classified("GetObject", full):
            self.store.client.download_file(self.store.bucket, full, str(local))
        return local

    def scratch_path(self, key: str, scratch: Path) -> Path:
        return scratch / staging_name(key)

    def publish(self, local: Path, key: str) -> None:
        self.store.upload_file(local, key)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self.store.full_key(k)} for k in keys[start:start + 1000]]
            with self.store.classified("DeleteObjects", batch[0]["Key"]):
                answer = self.store.client.delete_objects(
                    Bucket=self.store.bucket, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OSError(f"DeleteObjects {first.get('Key')}: {first.get('Code')}")
