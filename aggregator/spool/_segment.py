"""The spool's on-disk formats: segment files and their records.

A segment file starts with a header, then holds records back to back (integers big-endian):

    header (32 bytes in format 1)
      8s   magic b"EVAGGSPL"                       } bytes 0-11 mean the same in every format
      u16  format version                          }
      u16  header length                           }
      u16  payload schema version (sinks.schema.SCHEMA_VERSION)
      u16  flags (0)
      u64  first offset
      u32  reserved (0)
      u32  CRC32 of the header bytes before it     <- always the header's last 4 bytes
    record
      u32  body length
      u32  CRC32 of the body
      body: u64 offset, 16s session, u64 seq, i64 received_ns, u32 count, payload
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from sinks.records import SpoolRecord

MAGIC: Final = b"EVAGGSPL"
FORMAT_VERSION: Final = 1
READABLE_VERSIONS: Final = frozenset({1})
SEGMENT_SUFFIX: Final = ".seg"

_PREFIX = struct.Struct(">8sHH")  # magic, version, header length
_HEADER_V1 = struct.Struct(">8sHHHHQI")  # ... payload schema, flags, first offset, reserved
_CRC = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER_V1.size + _CRC.size
FRAME = struct.Struct(">II")  # body length, crc32(body)
BODY_HEAD = struct.Struct(">Q16sQqI")  # offset, session, seq, received_ns, count
RECORD_OVERHEAD: Final = FRAME.size + BODY_HEAD.size
MAX_BODY: Final = 1 << 30
MAX_OFFSET: Final = 1 << 62  # far beyond any real spool; keeps offsets in int64
_NAME = re.compile(r"^(\d{20})\.seg$")

SessionMarks = dict[bytes, tuple[int, int, int]]  # session -> (max seq, its offset, received_ns)


class SpoolVersionError(RuntimeError):
    """The spool holds segments written by a newer agent; this agent refuses to touch them."""


class BadHeaderError(Exception):
    """A segment header that cannot be read: `torn` when cut short, else corrupt."""

    def __init__(self, torn: bool) -> None:
        super().__init__("torn" if torn else "corrupt")
        self.torn = torn


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    version: int
    size: int
    payload_schema: int
    first_offset: int


def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    match = _NAME.match(name)
    offset = int(match.group(1)) if match else 0
    return offset if 0 < offset < MAX_OFFSET else None


def encode_header(first_offset: int, payload_schema: int) -> bytes:
    head = _HEADER_V1.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, payload_schema, 0, first_offset, 0)
    return head + _CRC.pack(zlib.crc32(head))


def read_header(f: BinaryIO) -> SegmentHeader:
    """Read and check a segment header; raises BadHeaderError or SpoolVersionError."""
    data = f.read(_PREFIX.size)
    if len(data) < _PREFIX.size:
        raise BadHeaderError(torn=True)
    magic, version, size = _PREFIX.unpack_from(data)
    if magic != MAGIC or size < _PREFIX.size + _CRC.size:
        raise BadHeaderError(torn=False)
    data += f.read(size - _PREFIX.size)
    if len(data) < size:
        raise BadHeaderError(torn=True)
    (crc,) = _CRC.unpack_from(data, size - _CRC.size)
    if zlib.crc32(data[: size - _CRC.size]) != crc:
        raise BadHeaderError(torn=False)
    if version not in READABLE_VERSIONS:
        raise SpoolVersionError(
            f"spool segment format {version} is newer than this agent reads "
            f"({sorted(READABLE_VERSIONS)}); run a newer evagg or move the spool away"
        )
    _, _, _, schema, _, first, _ = _HEADER_V1.unpack_from(data)
    return SegmentHeader(version, size, schema, first)


def record_head(
    offset: int, session: bytes, seq: int, received_ns: int, count: int, payload: bytes
) -> bytes:
    """Frame header plus fixed body header; the payload follows it on disk."""
    fixed = BODY_HEAD.pack(offset, session, seq, received_ns, count)
    crc = zlib.crc32(payload, zlib.crc32(fixed))
    return FRAME.pack(len(fixed) + len(payload), crc) + fixed


class TornWriteError(OSError):
    """A failed write left a partial record that could not be cut off again."""


def write_frame(fd: int, head: bytes, payload: bytes, position: int) -> None:
    """Append one record; on failure (disk full) cut the file back to `position`."""
    total = len(head) + len(payload)
    try:
        written = os.writev(fd, (head, payload))
        if written < total:  # only on a nearly full disk; the rest raises ENOSPC
            data = head + payload
            while written < total:
                written += os.write(fd, data[written:])
    except OSError:
        try:
            os.ftruncate(fd, position)
        except OSError as exc:
            raise TornWriteError(exc.errno, f"could not remove a partial record: {exc}") from exc
        raise


def decode_records(data: bytes, min_offset: int) -> tuple[list[SpoolRecord], bool]:
    """Parse consecutive frames read from a segment; stops at the first bad one (returns False)."""
    out: list[SpoolRecord] = []
    pos, end = 0, len(data)
    with memoryview(data) as view:
        while pos < end:
            if end - pos < RECORD_OVERHEAD:
                return out, False
            length, crc = FRAME.unpack_from(view, pos)
            body = pos + FRAME.size
            stop = body + length
            if stop > end or length < BODY_HEAD.size or zlib.crc32(view[body:stop]) != crc:
                return out, False
            offset, session, seq, received_ns, count = BODY_HEAD.unpack_from(view, body)
            if offset >= min_offset:
                payload = bytes(view[body + BODY_HEAD.size : stop])
                out.append(SpoolRecord(offset, session, seq, received_ns, count, payload))
            pos = stop
    return out, True


class SegmentIndex:
    """What the spool keeps in memory about one segment file: where each record starts."""

    __slots__ = (
        "cum_events", "fd", "first_offset", "offsets", "path", "positions", "size", "version"
    )

    def __init__(self, path: Path, first_offset: int, version: int, size: int) -> None:
        self.path = path
        self.first_offset = first_offset
        self.version = version
        self.size = size  # bytes in the file, up to the end of the last good record
        self.fd: int | None = None  # open for appending while this is the active segment
        self.offsets = array("q")
        self.positions = array("q")
        self.cum_events = array("q")  # running sum of events through each record

    @property
    def records(self) -> int:
        return len(self.offsets)

    @property
    def events(self) -> int:
        return self.cum_events[-1] if self.cum_events else 0

    @property
    def last_offset(self) -> int:
        return self.offsets[-1] if self.offsets else self.first_offset - 1

    def add(self, offset: int, position: int, count: int, end: int) -> None:
        self.offsets.append(offset)
        self.positions.append(position)
        self.cum_events.append(self.events + count)
        self.size = end

    def find(self, offset: int) -> int:
        """Index of the first record with an offset >= `offset`."""
        return bisect_left(self.offsets, offset)

    def events_from(self, index: int) -> int:
        return self.events - (self.cum_events[index - 1] if index > 0 else 0)

    def end_of(self, index: int) -> int:
        return self.positions[index + 1] if index + 1 < self.records else self.size


def create_segment(directory: Path, first_offset: int, payload_schema: int) -> tuple[Path, int]:
    """A new, empty segment open for appending; returns its path and fd."""
    path = directory / segment_name(first_offset)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o640)
    try:
        header = encode_header(first_offset, payload_schema)
        if os.write(fd, header) != len(header):
            raise OSError(f"short write creating {path.name}")
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return path, fd


def open_for_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
