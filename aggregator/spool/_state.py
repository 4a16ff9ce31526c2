"""The small files beside the spool's segments: lock, spool id, sink cursors, dedupe marks.

Each is replaced atomically (write a temporary file, fsync, rename), so a crash leaves
either the old or the new version, never a mix.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import struct
import time
import zlib
from hashlib import sha256
from pathlib import Path
from typing import Final

from aggregator.spool._segment import MAX_OFFSET, SessionMarks
from sinks.durable import write_durably

log = logging.getLogger("evagg.spool")

_CRC = struct.Struct(">I")

CURSOR_DIR: Final = "cursors"
QUARANTINE_DIR: Final = "quarantine"
MARKS_FILE: Final = "sessions.marks"
ID_FILE: Final = "spool_id"
LOCK_FILE: Final = "lock"
_SAFE_SINK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_MARKS_MAGIC: Final = b"EVAGGSES"
_MARKS_HEAD = struct.Struct(">8sHQI")  # magic, version, next offset, entries
_MARK = struct.Struct(">16sQQq")  # session, max seq, its offset, received_ns


class SpoolLockedError(RuntimeError):
    """Another process has this spool directory open."""


def lock_directory(directory: Path) -> int:
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpoolLockedError(
            f"spool {directory} is in use by another evagg agent: stop that one first "
            "(`evagg status` shows it), or give this one a --state-dir of its own") from None
    return fd


def atomic_write(path: Path, data: bytes) -> None:
    """Replace a small state file. The directory is not synced: a crash before the rename
    reaches the disk leaves the previous state, and every state file is safe to be old
    (a cursor behind means a resend the sinks absorb)."""
    write_durably(path, data, temporary=path.with_name(path.name + ".tmp"), sync_directory=False)


def remove_temp_files(directory: Path) -> None:
    for folder in (directory, directory / CURSOR_DIR):
        for tmp in folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)


def load_spool_id(directory: Path) -> str:
    path = directory / ID_FILE
    try:
        text = path.read_bytes().decode("ascii", "replace").strip()
    except FileNotFoundError:
        text = ""
    if re.fullmatch(r"[0-9a-f]{32}", text):
        return text
    new_id = os.urandom(16).hex()
    atomic_write(path, (new_id + "\n").encode())
    return new_id


def cursor_path(directory: Path, sink: str) -> Path:
    stem = sink if _SAFE_SINK.match(sink) else "sha256-" + sha256(sink.encode()).hexdigest()[:32]
    return directory / CURSOR_DIR / f"{stem}.json"


def write_cursor(directory: Path, sink: str, next_offset: int) -> None:
    doc = {"sink": sink, "next_offset": next_offset}
    atomic_write(cursor_path(directory, sink), json.dumps(doc).encode())


def read_cursors(directory: Path) -> tuple[dict[str, int], list[str]]:
    """The committed cursors, and the names of cursor files that could not be read."""
    cursors: dict[str, int] = {}
    bad: list[str] = []
    for path in sorted((directory / CURSOR_DIR).glob("*.json")):
        try:
            doc = json.loads(path.read_bytes())
            sink, offset = doc["sink"], doc["next_offset"]
            if not (isinstance(sink, str) and isinstance(offset, int) and 0 < offset < MAX_OFFSET):
                raise ValueError("bad cursor fields")
        except (ValueError, KeyError, TypeError):
            bad.append(path.name)
            continue
        cursors[sink] = offset
    return cursors, bad


def write_marks(path: Path, next_offset: int, marks: SessionMarks) -> None:
    """Persist dedupe marks of sessions whose records are no longer in any segment."""
    entries = b"".join(_MARK.pack(s, seq, off, ns) for s, (seq, off, ns) in marks.items())
    body = _MARKS_HEAD.pack(_MARKS_MAGIC, 1, next_offset, len(marks)) + entries
    atomic_write(path, body + _CRC.pack(zlib.crc32(body)))


def read_marks(path: Path) -> tuple[int, SessionMarks] | None:
    """(next offset then, marks); None when the file is damaged or of an unknown version."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0, {}
    if len(data) < _MARKS_HEAD.size + _CRC.size:
        return None
    magic, version, next_offset, count = _MARKS_HEAD.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    expected = _MARKS_HEAD.size + count * _MARK.size + _CRC.size
    if magic != _MARKS_MAGIC or version != 1 or len(data) != expected:
        return None
    if zlib.crc32(data[: -_CRC.size]) != crc:
        return None
    marks: SessionMarks = {}
    for i in range(count):
        session, seq, offset, ns = _MARK.unpack_from(data, _MARKS_HEAD.size + i * _MARK.size)
        marks[session] = (seq, offset, ns)
    return next_offset, marks


def prune_quarantine(quarantine: Path, keep: int) -> None:
    """Keep the newest `keep` quarantined files so repeated damage cannot fill the disk."""
    def quarantined_at(path: Path) -> int:
        stamp = path.name.rsplit(".", 2)[-2]
        return int(stamp) if stamp.isdigit() else 0

    files = sorted(quarantine.glob("*.corrupt"), key=quarantined_at)
    for old in files[: max(0, len(files) - keep)]:
        old.unlink(missing_ok=True)


class DedupeMarks:
    """The highest seq stored per producer session, and the offset that holds it.

    Producers resend unacked frames in order, so the highest seq is enough to know which
    frames are stored. The marks come back at start from the segments; the file keeps the
    marks of sessions whose segments are gone, until they have been idle for `ttl_ns`.
    """

    def __init__(self, path: Path, ttl_ns: int) -> None:
        self.path = path
        self.ttl_ns = ttl_ns
        self.marks: SessionMarks = {}

    def load(self) -> int:
        """Read the file; returns the next offset it recorded (0 when there is none)."""
        saved = read_marks(self.path)
        if saved is None:
            log.warning("spool: dedupe marks file is damaged; resent old frames may repeat")
            return 0
        next_offset, self.marks = saved
        return next_offset

    def merge(self, more: SessionMarks) -> None:
        for session, mark in more.items():
            known = self.marks.get(session)
            if known is None or mark[0] > known[0]:
                self.marks[session] = mark

    def stored_at(self, session: bytes, seq: int) -> int | None:
        mark = self.marks.get(session)
        return mark[1] if mark is not None and seq <= mark[0] else None

    def note(self, session: bytes, seq: int, offset: int, received_ns: int) -> None:
        self.marks[session] = (seq, offset, received_ns)

    def save_leaving(self, old_first: int, new_first: int, next_offset: int) -> None:
        """Before segments [old_first, new_first) go: persist every mark they held."""
        leaving = {s: m for s, m in self.marks.items() if m[1] < new_first}
        if not any(m[1] >= old_first for m in leaving.values()):
            return
        cutoff = time.time_ns() - self.ttl_ns
        for session, mark in list(leaving.items()):
            if mark[2] < cutoff:
                del leaving[session], self.marks[session]
        write_marks(self.path, next_offset, leaving)
