"""Recovery at start: check every record of a segment and repair what a crash or damage left.

- A torn tail (the last segment ends in a partial record, or in bytes that frame no
  record: the write a crash interrupted) is cut at the last good record. It is not a
  loss; that write was never acknowledged under fsync "always".
- A corrupt record (bad CRC, or an offset out of order) whose next record frames and
  checks is dropped alone; bytes that frame no record anywhere else drop the rest of
  that segment. The good records are copied to a new file that replaces the segment,
  and the original is kept, whole, in quarantine.
- A bad header (bad magic or CRC) moves the segment to quarantine; one cut short in the
  last segment (a crash while creating it) is deleted.

Cases, counters and losses: docs/spool.md, "Recovery at start".
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from aggregator.spool._segment import (
    BODY_HEAD,
    FRAME,
    MAX_BODY,
    RECORD_OVERHEAD,
    BadHeaderError,
    SegmentHeader,
    SegmentIndex,
    SessionMarks,
    read_header,
)
from sinks.durable import fsync_directory


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
        except BadHeaderError as exc:
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
    fsync_directory(path.parent)
    corrupt = len(scan.bad) + (1 if scan.tail is not None and not torn_tail else 0)
    return Recovered(index, scan.sessions, 0, corrupt, scan.lost_events, [str(target)])


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        os.fsync(f.fileno())


def quarantine_path(quarantine: Path, path: Path) -> Path:
    quarantine.mkdir(exist_ok=True)
    return quarantine / f"{path.name}.{time.time_ns()}.corrupt"
