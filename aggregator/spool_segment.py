"""The spool's on-disk formats: segment files and their records, and how a damaged one is repaired.

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

import mmap
import os
import re
import struct
import time
import zlib
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

from aggregator.records import SpoolRecord

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


class _BadHeader(Exception):
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
    """Read and check a segment header; raises _BadHeader or SpoolVersionError."""
    data = f.read(_PREFIX.size)
    if len(data) < _PREFIX.size:
        raise _BadHeader(torn=True)
    magic, version, size = _PREFIX.unpack_from(data)
    if magic != MAGIC or size < _PREFIX.size + _CRC.size:
        raise _BadHeader(torn=False)
    data += f.read(size - _PREFIX.size)
    if len(data) < size:
        raise _BadHeader(torn=True)
    (crc,) = _CRC.unpack_from(data, size - _CRC.size)
    if zlib.crc32(data[: size - _CRC.size]) != crc:
        raise _BadHeader(torn=False)
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


@dataclass
class Recovered:
    """One segment after recovery: what is left of it and what was lost."""

    index: SegmentIndex | None
    sessions: SessionMarks = field(default_factory=dict)
    truncated_bytes: int = 0
    corrupt_records: int = 0
    lost_events: int = 0  # events of corrupt records whose header could still be trusted
    quarantined: list[str] = field(default_factory=list)


@dataclass
class _Scan:
    header: SegmentHeader
    index: SegmentIndex
    sessions: SessionMarks
    bad: list[int]  # positions of single bad records whose neighbours frame correctly
    lost_events: int
    tail: int | None  # where unusable bytes start, up to the end of the file
    tail_is_torn: bool  # the tail looks like one interrupted write, not damage


def recover_segment(path: Path, *, prev_offset: int, is_last: bool, quarantine: Path) -> Recovered:
    """Check every record of a segment; cut a torn tail, move damage aside, keep the rest.

    Only the last segment can have a torn tail (the write a crash interrupted); anything
    unusable elsewhere is damage: the good records are kept, the original is quarantined.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            header = read_header(f)
        except _BadHeader as exc:
            return _bad_header(path, size, torn=exc.torn and is_last, quarantine=quarantine)
        if size == header.size:
            return Recovered(SegmentIndex(path, header.first_offset, header.version, size))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            scan = _scan(mm, path, header, size, prev_offset)
            torn = scan.tail is not None and scan.tail_is_torn and is_last
            damaged = bool(scan.bad) or (scan.tail is not None and not torn)
            if damaged:
                result = _rewrite(mm, path, scan, quarantine, torn_tail=torn)
            else:
                result = Recovered(scan.index, scan.sessions)
    if torn and scan.tail is not None:
        if not damaged:
            _truncate(path, scan.tail)
        result.truncated_bytes = size - scan.tail
    return result


def _bad_header(path: Path, size: int, *, torn: bool, quarantine: Path) -> Recovered:
    if torn:  # a crash while the segment was being created
        path.unlink()
        return Recovered(None, truncated_bytes=size)
    target = quarantine_path(quarantine, path)
    os.replace(path, target)
    return Recovered(None, corrupt_records=1, quarantined=[str(target)])


def _scan(mm: mmap.mmap, path: Path, header: SegmentHeader, size: int, prev: int) -> _Scan:
    scan = _Scan(header, SegmentIndex(path, header.first_offset, header.version, header.size),
                 {}, [], 0, None, False)
    prev = max(prev, header.first_offset - 1)
    pos = header.size
    with memoryview(mm) as view:
        while pos < size:
            ok, end, fields = _check_frame(view, pos, size, prev)
            if ok and fields is not None:
                _add(scan, fields, pos, end)
                prev = fields[0]
                pos = end
                continue
            if end < size and fields is not None and _check_frame(view, end, size, prev)[0]:
                scan.bad.append(pos)  # framing holds on both sides: only this record is bad
                scan.lost_events += _trusted_count(fields, prev, end - pos)
                pos = end
                continue
            scan.tail = pos
            scan.tail_is_torn = fields is None or end == size
            if not scan.tail_is_torn and fields is not None:
                scan.lost_events += _trusted_count(fields, prev, end - pos)
            break
    return scan


Fields = tuple[int, bytes, int, int, int]


def _check_frame(
    view: memoryview, pos: int, size: int, prev: int
) -> tuple[bool, int, Fields | None]:
    """(record is good, where it ends, its header fields); fields None when not even framed."""
    if size - pos < RECORD_OVERHEAD:
        return False, size, None
    length, crc = FRAME.unpack_from(view, pos)
    end = pos + FRAME.size + length
    if length < BODY_HEAD.size or length > MAX_BODY or end > size:
        return False, size, None
    fields: Fields = BODY_HEAD.unpack_from(view, pos + FRAME.size)
    good = fields[0] > prev and zlib.crc32(view[pos + FRAME.size : end]) == crc
    return good, end, fields


def _trusted_count(fields: Fields, prev: int, frame_bytes: int) -> int:
    """A bad record's event count, when its header still looks like the expected record."""
    offset, _, _, _, count = fields
    return count if offset == prev + 1 and count <= frame_bytes else 0


def _add(scan: _Scan, fields: Fields, pos: int, end: int) -> None:
    offset, session, seq, received_ns, count = fields
    scan.index.add(offset, pos, count, end)
    if seq > 0 and any(session):
        known = scan.sessions.get(session)
        if known is None or seq > known[0]:
            scan.sessions[session] = (seq, offset, received_ns)


def _rewrite(
    mm: mmap.mmap, path: Path, scan: _Scan, quarantine: Path, *, torn_tail: bool
) -> Recovered:
    """Write the good records to a new file; the original stays in quarantine for inspection."""
    tmp = path.with_name(path.name + ".tmp")
    index = SegmentIndex(path, scan.header.first_offset, scan.header.version, scan.header.size)
    with open(tmp, "wb") as out:
        out.write(mm[: scan.header.size])
        old = scan.index
        for i in range(old.records):  # not contiguous: bad records sit between some of them
            start = old.positions[i]
            frame = FRAME.size + FRAME.unpack_from(mm, start)[0]
            out.write(mm[start : start + frame])
            count = old.cum_events[i] - (old.cum_events[i - 1] if i else 0)
            index.add(old.offsets[i], index.size, count, index.size + frame)
        out.flush()
        os.fsync(out.fileno())
    target = quarantine_path(quarantine, path)
    os.link(path, target)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    corrupt = len(scan.bad) + (1 if scan.tail is not None and not torn_tail else 0)
    return Recovered(index, scan.sessions, 0, corrupt, scan.lost_events, [str(target)])


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        os.fsync(f.fileno())


def quarantine_path(quarantine: Path, path: Path) -> Path:
    quarantine.mkdir(exist_ok=True)
    return quarantine / f"{path.name}.{time.time_ns()}.corrupt"


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


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

