"""Files that survive a crash: written to a temporary name, fsynced, renamed into place,
and the directory entry fsynced, so that after a power cut a path holds the old complete
file or the new complete one, never a torn one. The spool, the dead letters, the local
Parquet store and compaction all publish their files this way."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: Path) -> None:
    """Persist the directory's entries (a rename or a new file in it)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_file(staged: Path, final: Path, *, synced_up_to: Path | None = None) -> None:
    """Move a finished file into place durably. With `synced_up_to`, every directory from
    the file's own up to that one is synced too (the partition folders may be new)."""
    fsync_file(staged)
    os.replace(staged, final)
    directory = final.parent
    while True:
        fsync_directory(directory)
        if synced_up_to is None or directory == synced_up_to or directory.parent == directory:
            return
        directory = directory.parent


def write_durably(path: Path, data: bytes | bytearray | memoryview, *,
                  temporary: Path | None = None, sync_directory: bool = True) -> None:
    """Replace `path` with `data`: the file is complete on disk before its name points
    at it. `temporary` names the scratch file (by default a hidden one beside `path`)."""
    scratch = temporary or path.with_name(f".{path.name}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(scratch, path)
    if sync_directory:
        fsync_directory(path.parent)
