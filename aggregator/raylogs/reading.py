"""One step of one followed file: what changed on disk, and the next piece to ship.

Runs in the follower's thread. Ray's files only grow, so a piece is the bytes between
what is shipped and the current end, at most MAX_PIECE_BYTES. What else can happen:

- rotation: the name now holds another file (another inode). The old one is looked for
  among `<name>.1` ... `<name>.9` and read to its end there; then the next generation
  starts at 0 under the name.
- truncation: the same file is shorter than what was shipped: the next generation
  starts at 0.
- deletion: the file is gone with bytes never read (or was never seen at all within
  APPEAR_WAIT_S of the event naming it): a loss.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aggregator.raylogs.named import inside
from aggregator.raylogs.state import Followed

MAX_PIECE_BYTES: Final = 8 * 1024 * 1024
APPEAR_WAIT_S: Final = 10.0  # Ray creates a worker's files before it runs anything
ROTATED_BACKUPS: Final = 9


@dataclass(frozen=True, slots=True)
class Piece:
    followed: Followed
    start: int
    end: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Lost:
    """A file (or the unread rest of one) that can no longer be read."""

    followed: Followed
    reason: str  # ray_log_deleted, ray_log_missing, ray_log_truncated
    unread_bytes: int


Step = Piece | Lost | None


def step(followed: Followed, root: Path, now: float) -> Step:
    """The next piece of `followed`, a loss, or None when nothing is new."""
    try:
        info = os.lstat(followed.path)
    except FileNotFoundError:
        return _gone(followed, now)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        followed.done = True
        return Lost(followed, "ray_log_refused", 0)
    if followed.inode is None:
        followed.inode = info.st_ino
    if info.st_ino != followed.inode:
        return _rotated(followed, info, root)
    if info.st_size < followed.offset:
        return _new_generation(followed, info.st_ino, "ray_log_truncated")
    return _read(followed, followed.path, info.st_size)


def _gone(followed: Followed, now: float) -> Step:
    if followed.inode is None and now - followed.named_at < APPEAR_WAIT_S:
        return None  # not written yet: Ray names a file as it creates it
    rest = _rotated_path(followed)
    if rest is not None:
        return _read_rotated(followed, rest)
    followed.done = True
    if followed.inode is None:
        return Lost(followed, "ray_log_missing", 0)
    unread = max(0, followed.seen_size - followed.offset)
    return Lost(followed, "ray_log_deleted", unread) if unread else None


def _rotated(followed: Followed, info: os.stat_result, root: Path) -> Step:
    rest = _rotated_path(followed)
    if rest is not None and inside(root, rest):
        found = _read_rotated(followed, rest)
        if found is not None:
            return found
    return _new_generation(followed, info.st_ino, "ray_log_deleted")


def _read_rotated(followed: Followed, path: str) -> Step:
    size = os.lstat(path).st_size
    if followed.offset < size:
        return _read(followed, path, size)
    return None


def _rotated_path(followed: Followed) -> str | None:
    """Where the generation being read went when Ray rotated it, if anywhere."""
    for n in range(1, ROTATED_BACKUPS + 1):
        candidate = f"{followed.path}.{n}"
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_ino == followed.inode:
            return candidate
    return None


def _new_generation(followed: Followed, inode: int, reason: str) -> Step:
    unread = max(0, followed.seen_size - followed.offset)
    followed.generation += 1
    followed.inode, followed.offset, followed.seen_size = inode, 0, 0
    followed.intent_end = None
    return Lost(followed, reason, unread) if unread else None


def _read(followed: Followed, path: str, size: int) -> Step:
    followed.seen_size = max(followed.seen_size, size)
    end = followed.intent_end or min(size, followed.offset + MAX_PIECE_BYTES)
    if end <= followed.offset:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != followed.inode:
            return None  # replaced between lstat and open: the next step sees it
        data = os.pread(fd, end - followed.offset, followed.offset)
    finally:
        os.close(fd)
    if len(data) < end - followed.offset:  # shorter than promised: a truncation
        followed.intent_end = None
        return None
    return Piece(followed, followed.offset, end, data)
