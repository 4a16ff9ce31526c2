"""The spool: durable, bounded, append-only storage of accepted batches, one cursor per sink.

This module holds the policies: dedupe of resent frames, what happens when the spool is
full, cursors and which segments they allow to delete, and what it loses (recorded in
the agent's one `LossRecorder`, aggregator/losses.py).
The files themselves are `spool_log.SegmentLog`'s. Format and recovery: docs/spool.md.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aggregator.losses import LossRecorder
from aggregator.spool._counters import SpoolCounters
from aggregator.spool._cursors import Cursors
from aggregator.spool._disk_reserve import DiskReserve
from aggregator.spool._full_words import FullSpoolWords
from aggregator.spool._log import SegmentLog
from aggregator.spool._recent import RECENT_BYTES
from aggregator.spool._recovery import Recovered
from aggregator.spool._room_queue import RoomQueue
from aggregator.spool._segment import HEADER_SIZE, RECORD_OVERHEAD
from aggregator.spool._signal import Signal
from aggregator.spool._state import (
    CURSOR_DIR,
    MARKS_FILE,
    DedupeMarks,
    load_spool_id,
    lock_directory,
    remove_temp_files,
)
from aggregator.spool._write_health import WriteFailure, WriteHealth
from emitters.ratelimit import RateLimitedLog
from emitters.wire import NO_SESSION, SESSION_BYTES
from sinks.records import SpoolRecord

log = logging.getLogger("evagg.spool")

SESSION_TTL_NS = 7 * 24 * 3600 * 10**9  # dedupe marks of sessions idle this long are forgotten
FULL_DISK_UNLINK_WAIT_S = 5.0  # a commit on a full disk waits this long for queued unlinks
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
DROP_UNLINK_WAIT_S = 1.0  # drop_oldest waits this long for queued unlinks before dropping
# A write the disk refused is tried again this often at least: room may come from outside
# the spool (another file deleted), which fires nothing here.
DISK_RETRY_S = 1.0


@dataclass(frozen=True)
class RecoveryReport:
    segments: int
    records: int
    truncated_bytes: int
    corrupt_records: int
    quarantined_files: list[str]


@dataclass(frozen=True)
class AppendResult:
    offset: int | None
    duplicate: bool


class SpoolClosed(RuntimeError):
    """The spool is closed (or not yet open) while a call needed it."""


class Spool:
    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        when_full: Literal["block", "drop_oldest"] = "block",
        fsync: Literal["os", "always"] = "os",
        segment_bytes: int = 64 * 2**20,
        losses: LossRecorder | None = None,
        recent_bytes: int = RECENT_BYTES,  # the newest records' payloads kept for readers
    ) -> None:
        if when_full not in ("block", "drop_oldest"):
            raise ValueError(f"when_full must be 'block' or 'drop_oldest', not {when_full!r}")
        if fsync not in ("os", "always"):
            raise ValueError(f"fsync must be 'os' or 'always', not {fsync!r}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.when_full = when_full
        self.fsync = fsync
        # A quarter of the cap at most, so a full spool always has sealed segments to free.
        segment_bytes = min(segment_bytes, max_bytes // 4)
        self.max_record_bytes = segment_bytes - HEADER_SIZE - RECORD_OVERHEAD
        if self.max_record_bytes < 1:
            raise ValueError(f"spool max_bytes {max_bytes} is too small to hold a record")
        self.spool_id = ""
        self.losses = losses or LossRecorder()  # drop_oldest, corrupt_record
        self.counters = SpoolCounters()
        self._log = SegmentLog(self.directory, segment_bytes=segment_bytes,
                               fsync_always=fsync == "always", counters=self.counters,
                               on_recovered=self._count_recovery, on_visible=self._wake_readers,
                               on_freed=self._notify_room, unlink=self._unlink_segment,
                               recent_bytes=recent_bytes)
        self._marks = DedupeMarks(self.directory / MARKS_FILE, SESSION_TTL_NS)
        self._cursors = Cursors(self.directory)
        self._room_queue = RoomQueue(self._has_room)
        self._data_arrived = Signal()
        self._lock_fd: int | None = None
        self._state = "new"
        self._words = FullSpoolWords()  # what the log says of a full spool
        self._health = WriteHealth()  # whether appends fail now (a full disk)
        self._disk_reserve = DiskReserve(self.directory)  # left free for the sinks' files
        self._full_disk_log = RateLimitedLog(log)  # cursors a full disk keeps in memory

    @property
    def bytes_used(self) -> int:
        return self._log.bytes_used

    @property
    def write_failure(self) -> WriteFailure | None:
        """Why appends fail now, and since when; None while they succeed."""
        return self._health.failure

    @property
    def first_offset(self) -> int:
        return self._log.first_offset

    @property
    def next_offset(self) -> int:
        return self._log.next_offset

    # -- opening and closing ---------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Recover from disk. Raises only for the environment (permissions, another agent
        on the same directory, segments of a newer format), never for damaged data."""
        if self._state != "new":
            raise RuntimeError("a Spool is opened once")
        (self.directory / CURSOR_DIR).mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_directory(self.directory)
        try:
            remove_temp_files(self.directory)
            self.spool_id = load_spool_id(self.directory)
            bad = self._cursors.load()
            if bad:
                log.warning("spool: ignoring unreadable cursor files %s", bad)
            floor = max(1, self._marks.load(), self._cursors.highest())
            total = self._log.recover(floor, self._marks)
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise
        self._state = "open"
        segments = self._log.segments
        return RecoveryReport(len(segments), sum(s.records for s in segments),
                              total.truncated_bytes, total.corrupt_records, total.quarantined)

    def close(self) -> None:
        """Fsync and close the files; appends still waiting fail with SpoolClosed."""
        if self._state == "closed":
            return
        self._state = "closed"
        self._words.say_dropped()  # drops the minute's limit held back: said before exit
        self._log.close()
        self._room_queue.changed.fire()
        self._data_arrived.fire()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- appending -------------------------------------------------------------------------

    async def append(self, payload: bytes, count: int, *, received_ns: int,
                     session: bytes = NO_SESSION, seq: int = 0,
                     room_wait_s: float | None = None) -> AppendResult:
        """Store one record; returns once it is written (and fsynced with "always").
        Under `block`, a full spool makes it wait for room: at most `room_wait_s` (then
        SpoolFull, nothing written), or for as long as it takes."""
        self._check_open()
        self._check_record(payload, count, received_ns, session, seq)
        stored = self._stored_at(session, seq)
        if stored is None:
            size = RECORD_OVERHEAD + len(payload)
            if self._room_queue.anyone_waiting or not self._has_room(size):
                await self._make_room(size, room_wait_s)
                stored = self._stored_at(session, seq)  # its twin may have landed meanwhile
        if stored is not None:
            self.counters.duplicates += 1
            if self.fsync == "always":
                await self._log.sync_through(stored)
            return AppendResult(None, True)
        try:  # a full disk (before the cap) or a broken one: the caller gets the OSError
            offset = self._write(payload, count, received_ns, session, seq)
            if seq > 0 and session != NO_SESSION:
                self._marks.note(session, seq, offset, received_ns)
            self.counters.appended_records += 1
            self.counters.appended_events += count
            if self.fsync == "always":
                await self._log.sync_through(offset)
        except OSError as exc:
            self._health.failed(exc)
            raise
        self._health.succeeded()
        return AppendResult(offset, False)

    def _write(self, payload: bytes, count: int, received_ns: int, session: bytes,
               seq: int) -> int:
        size = RECORD_OVERHEAD + len(payload)
        try:
            self._disk_reserve.check(size)
            return self._log.write(payload, count, received_ns, session, seq)
        except OSError as exc:
            if exc.errno not in _DISK_FULL or not self._free_disk_of_delivered():
                raise
            self._disk_reserve.check(size)
            return self._log.write(payload, count, received_ns, session, seq)

    def _free_disk_of_delivered(self) -> bool:
        """The disk is full: if every sink has passed every record, delete them all, the
        segment taking appends too (_log.remove_all). Returns whether anything went."""
        floor = self._pin_floor()
        if floor is None or floor < self.next_offset or self.first_offset >= self.next_offset:
            return False
        self._save_marks_leaving(self.next_offset, keep_on_failure=False)
        self._log.remove_all()
        self._notify_room()
        self._full_disk_log.log(
            logging.WARNING, "freed", "disk full: every spooled record was delivered, so the "
            "spool deleted the segment it was writing too, to make room; free space on the "
            "spool's disk, or set spool.max_bytes below the disk's size (the agent's start "
            "names the figure) so that the spool's cap comes first")
        return True

    async def wait_for_disk(self) -> None:
        """After an append the disk refused: until a segment is freed, or DISK_RETRY_S;
        raises SpoolClosed once the spool closes."""
        self._check_open()
        await self._room_queue.changed.wait(asyncio.get_running_loop().time() + DISK_RETRY_S)
        self._check_open()

    def has(self, session: bytes, seq: int) -> bool:
        return self._stored_at(session, seq) is not None

    def _stored_at(self, session: bytes, seq: int) -> int | None:
        """The offset whose durability covers (session, seq), if that frame is stored."""
        if seq <= 0 or session == NO_SESSION:
            return None
        return self._marks.stored_at(session, seq)

    def _check_record(self, payload: bytes, count: int, received_ns: int,
                      session: bytes, seq: int) -> None:
        if len(payload) > self.max_record_bytes:
            raise ValueError(f"a record of {len(payload)} bytes exceeds the spool's limit of "
                             f"{self.max_record_bytes} (max_bytes/4 or the segment size)")
        if len(session) != SESSION_BYTES:
            raise ValueError(f"session must be {SESSION_BYTES} bytes, not {len(session)}")
        if not (0 <= count < 2**32 and 0 <= seq < 2**64 and -(2**63) <= received_ns < 2**63):
            raise ValueError("count, seq or received_ns out of range")

    def _has_room(self, size: int) -> bool:
        return self._log.bytes_used + self._log.room_needed(size) <= self.max_bytes

    @property
    def blocked(self) -> bool:
        """Appends wait for room now (when_full = "block"), or the last that had to wait
        gave up and its record would still not fit."""
        return self._room_queue.blocked

    async def _make_room(self, size: int, wait_s: float | None = None) -> None:
        self._log.settle()
        if self.when_full == "drop_oldest":
            # Space that unlinks under way will free is no reason to drop records.
            if not self._has_room(size) and self._log.unlinks_pending():
                await self._log.unlinked(DROP_UNLINK_WAIT_S)
                self._check_open()
            self._drop_oldest(size)
            return
        if not self._room_queue.anyone_waiting:  # the sinks holding the oldest segment
            oldest = self._log.segments[0]       # hold the room
            self._words.waiting(self._cursors.behind(oldest.last_offset + 1))
        self.counters.full_waits += 1
        await self._room_queue.wait(size, wait_s, self._check_open)

    def _notify_room(self) -> None:
        self._disk_reserve.look_again()
        self._room_queue.changed.fire()

    def _drop_oldest(self, size: int) -> None:
        """Unlinks on the loop: each freed segment must count before the next is chosen."""
        if self._log.must_roll(size):
            self._log.roll()  # so the segment written so far can go too
        while not self._has_room(size) and len(self._log.segments) > 1:
            victim = self._log.segments[0]
            floor = self._pin_floor()
            passed = 0 if floor is None else victim.find(floor)  # every sink is past these
            self._remove_oldest(1)
            events = victim.events_from(passed)
            self.losses.record("drop_oldest", events)
            self.counters.dropped_records += victim.records - passed
            behind = self._cursors.behind(self.first_offset)
            self._cursors.raise_to(self.first_offset)
            self._words.dropped(events, behind)

    # -- reading ---------------------------------------------------------------------------

    def read(self, start_offset: int, *, max_bytes: int = 8 * 2**20,
             max_records: int = 10_000) -> list[SpoolRecord]:
        """Records with offset >= start_offset in order; at least one if any is readable."""
        self._check_open()
        return self._log.read(start_offset, max_bytes, max_records)

    async def wait_for(self, offset: int, timeout: float) -> bool:
        """True once a record with an offset >= `offset` is readable (or was, before a drop)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._log.visible < offset and self._state == "open":
            if not await self._data_arrived.wait(deadline):
                break
        return self._log.visible >= offset

    def _wake_readers(self, offset: int) -> None:
        self._data_arrived.fire()

    # -- cursors and deletion --------------------------------------------------------------

    def cursor(self, sink: str) -> int:
        """The next offset `sink` needs; a new sink starts at the oldest record present."""
        return self._cursors.position(sink, self.first_offset)

    def commit(self, sink: str, next_offset: int) -> None:
        """Persist a sink's cursor, then delete the segments every configured sink has passed."""
        self._check_open()
        if not 1 <= next_offset <= self.next_offset:
            raise ValueError(f"cursor {next_offset} is beyond the spool's next offset "
                             f"{self.next_offset}")
        if next_offset <= self._cursors.committed(sink):
            return
        try:
            self._cursors.save(sink, next_offset)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            self._commit_on_full_disk(sink, next_offset)
            return
        self._delete_passed()

    def _commit_on_full_disk(self, sink: str, next_offset: int) -> None:
        """A full disk must not deadlock delivery (no cursor write, so no segment freed, so
        the disk stays full). Records below next_offset are delivered, so their segments may
        go before the cursor is durable: after a crash the sink restarts at the oldest record
        left, and nothing it skips was undelivered. Free them, then write the cursor."""
        self.counters.enospc_commits += 1
        self._cursors.move_without_saving(sink, next_offset)
        if not self._log.wait_unlinked(FULL_DISK_UNLINK_WAIT_S):  # the space they free
            log.warning("disk full: segment unlinks still under way after %gs",
                        FULL_DISK_UNLINK_WAIT_S)
        self._delete_passed(keep_marks_on_failure=False, background=False)
        try:
            self._save_cursor_on_full_disk(sink, next_offset)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            # Nothing could be freed (what the disk holds is still needed, or lies in the
            # segment being written). The sink did deliver: failing its delivery would
            # only send the same events again. The cursor holds in memory and the next
            # commit saves it; a crash before then resends what it covers.
            self._full_disk_log.log(
                logging.WARNING, "cursor", "disk full: the cursor of sink %s is kept in "
                "memory until the disk has room (a crash before then sends what it has "
                "delivered since again); free space on the spool's disk", sink)

    def _save_cursor_on_full_disk(self, sink: str, next_offset: int) -> None:
        try:
            self._cursors.save(sink, next_offset)
        except OSError as exc:
            if exc.errno not in _DISK_FULL or not self._free_disk_of_delivered():
                raise
            self._cursors.save(sink, next_offset)

    def register_sinks(self, names: Iterable[str]) -> None:
        """The configured sinks: from now on only their cursors hold segments back."""
        self._cursors.register(names, self.first_offset)
        if self._state == "open":
            self._delete_passed()

    def lag(self, sink: str) -> tuple[int, int]:
        """(records, events) that `sink` has not committed yet."""
        return self._log.pending_from(max(self._cursors.committed(sink), self.first_offset))

    def _pin_floor(self) -> int | None:
        return self._cursors.floor(self.first_offset)

    def _delete_passed(self, keep_marks_on_failure: bool = True, background: bool = True) -> None:
        """Delete the segments every sink has passed: on the event loop, the unlinks run
        in the reaper's thread (aggregator/spool/_reaper.py)."""
        floor = self._pin_floor()
        if floor is None:  # no sinks at all: keep everything until the cap
            return
        segments = self._log.segments
        count = 0
        while count < len(segments) - 1 and segments[count].last_offset < floor:
            count += 1
        if count:
            self._remove_oldest(count, keep_marks_on_failure, background=background)

    def _remove_oldest(self, count: int, keep_marks_on_failure: bool = True, *,
                       background: bool = False) -> None:
        self._save_marks_leaving(self._log.first_offset_after(count), keep_marks_on_failure)
        self._log.remove_oldest(count, background=background)
        self._notify_room()

    def _save_marks_leaving(self, new_first: int, keep_on_failure: bool) -> None:
        try:
            self._marks.save_leaving(self.first_offset, new_first, self.next_offset)
        except OSError as exc:
            # On a full disk, freeing space wins over remembering (session, seq) marks of
            # frames long acked: losing them risks a duplicate only if such an old frame
            # is resent, while keeping the segments would stop all ingest.
            if keep_on_failure or exc.errno not in _DISK_FULL:
                raise
            log.warning("disk full: dropped dedupe marks of segments being deleted")

    async def collected(self, timeout: float = 10.0) -> bool:
        """True once every segment unlink handed to the background thread has happened
        (and its space counts as free); False if `timeout` passed first."""
        return await self._log.unlinked(timeout)

    def _unlink_segment(self, path: Path) -> None:
        """Unlinks a collected segment, in the reaper's thread or inline (a subclass may
        watch it)."""
        path.unlink(missing_ok=True)

    # -- recovery counts -------------------------------------------------------------------

    def _count_recovery(self, found: Recovered) -> None:
        self.counters.truncated_bytes += found.truncated_bytes
        self.counters.corrupt_records += found.corrupt_records
        self.losses.record("corrupt_record", found.lost_events)
        if found.truncated_bytes or found.corrupt_records:
            name = found.index.path.name if found.index else "a segment"
            log.warning("spool: %s: cut %d torn bytes, %d corrupt records (%d events known), "
                        "original kept in %s", name, found.truncated_bytes,
                        found.corrupt_records, found.lost_events, found.quarantined or "-")

    def _check_open(self) -> None:
        if self._state != "open":
            raise SpoolClosed(f"spool {self.directory} is {self._state}, not open")
