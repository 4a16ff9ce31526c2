"""Which files of a watched directory are finished, found without following a symlink.

A file is finished when it has not been modified for the table's `settle` time and no
process this agent can see holds it open for writing (Linux: /proc/<pid>/fd). Names
that say "still being written" are never candidates: hidden names (`.x`) and names
ending `.tmp` or `.part`, which is how `emitters.torch.trace_handler()` and most tools
write a file before renaming it into place.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aggregator.config.files import WatchedFiles

IN_PROGRESS_SUFFIXES: Final = (".tmp", ".part")
_WRITE_MODES: Final = (os.O_WRONLY, os.O_RDWR)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A regular file below a watched directory, as one lstat saw it."""

    watched: WatchedFiles
    path: str  # absolute
    name: str  # the path below the watched directory, "/"-separated
    size: int
    mtime_ns: int
    device: int
    inode: int

    @property
    def identity(self) -> tuple[int, int]:
        return (self.size, self.mtime_ns)

    @property
    def run_id(self) -> str | None:
        """The table's run id, else the first directory level below the watched one."""
        if self.watched.run_id is not None:
            return self.watched.run_id
        first, slash, _ = self.name.partition("/")
        return first if slash else None


def candidates(watched: WatchedFiles) -> Iterator[Candidate]:
    """Every regular file below the directory; symlinked files and directories are skipped."""
    top = str(watched.path)
    for directory, folders, names in os.walk(top, followlinks=False):
        folders[:] = [f for f in folders if not f.startswith(".")]
        for file_name in names:
            if file_name.startswith(".") or file_name.endswith(IN_PROGRESS_SUFFIXES):
                continue
            path = os.path.join(directory, file_name)
            try:
                info = os.lstat(path)
            except OSError:  # gone between the listing and the look
                continue
            if not stat.S_ISREG(info.st_mode):
                continue  # a symlink, a fifo, a socket: never opened
            name = os.path.relpath(path, top).replace(os.sep, "/")
            yield Candidate(watched, path, name, info.st_size, info.st_mtime_ns,
                            info.st_dev, info.st_ino)


def settled(candidate: Candidate, now_ns: int) -> bool:
    return now_ns - candidate.mtime_ns >= candidate.watched.settle_s * 1e9


def open_for_writing(files: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which of these (device, inode) some visible process holds open for writing.

    Processes of other users are visible only to root; for them the settle time alone
    decides (docs/configuration.md says so)."""
    held: set[tuple[int, int]] = set()
    if not files:
        return held
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        held |= _held_by(pid, files)
    return held


def _held_by(pid: str, files: set[tuple[int, int]]) -> set[tuple[int, int]]:
    held: set[tuple[int, int]] = set()
    folder = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(folder)
    except OSError:  # gone, or another user's
        return held
    for fd in fds:
        try:
            info = os.stat(f"{folder}/{fd}")
        except OSError:
            continue
        key = (info.st_dev, info.st_ino)
        if key in files and _writing(pid, fd):
            held.add(key)
    return held


def _writing(pid: str, fd: str) -> bool:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as fdinfo:
            for line in fdinfo:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE in _WRITE_MODES
    except (OSError, ValueError):
        return False
    return False


def still_inside(watched: WatchedFiles, path: str) -> bool:
    """The file resolves below the watched directory (no directory was swapped for a
    symlink since the walk)."""
    top = os.path.realpath(watched.path)
    return os.path.realpath(path).startswith(top.rstrip(os.sep) + os.sep)


def watched_exists(watched: WatchedFiles) -> bool:
    return Path(watched.path).is_dir()
