"""The segment files of one spool directory in offset order: append, read, delete.

Appends run on the event loop (one `os.writev` per record); their fsyncs run in a thread
(`_group_commit.py`). Readers see a record once it is written ("os") or fsynced
("always").
Segments collected behind every cursor are unlinked in one background thread
(`_reaper.py`); their bytes count in `bytes_used` until the unlink has happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from aggregator.spool._counters import SpoolCounters
from aggregator.spool._group_commit import GroupCommit
from aggregator.spool._reaper import Doomed, SegmentReaper
from aggregator.spool._recent import RECENT_BYTES, RecentRecords
from aggregator.spool._recovery import Recovered, recover_segment
from aggregator.spool._segment import (
    FORMAT_VERSION,
    HEADER_SIZE,
    RECORD_OVERHEAD,
    SegmentIndex,
    TornWriteError,
    create_segment,
    decode_records,
    open_for_append,
    parse_segment_name,
    record_head,
    segment_name,
    write_frame,
)
from aggregator.spool._state import QUARANTINE_DIR, DedupeMarks, prune_quarantine
from sinks.records import SpoolRecord
from sinks.schema import SCHEMA_VERSION

log = logging.getLogger("evagg.spool")

QUARANTINE_KEEP = 8
CLOSE_WAIT_S = 2.0  # close() waits this long for queued unlinks; the next start does the rest


class _Damaged(Exception):
    def __init__(self, segment: SegmentIndex) -> None:
        super().__init__(segment.path.name)
        self.segment = segment


class SegmentLog:
    def __init__(self, directory: Path, *, segment_bytes: int, fsync_always: bool,
                 counters: SpoolCounters, on_recovered: Callable[[Recovered], None],
                 on_visible: Callable[[int], None], on_freed: Callable[[], None],
                 unlink: Callable[[Path], None], recent_bytes: int = RECENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync_always = fsync_always
        self.counters = counters
        self._on_recovered = on_recovered  # losses and logs of every repaired segment
        self._on_visible = on_visible
        self._on_freed = on_freed  # space of background unlinks became free
        self._unlink = unlink
        self._reaper = SegmentReaper(unlink)
        self._settled: asyncio.Future[None] | None = None
        self._unlink_errors_logged: set[str] = set()
        self.segments: list[SegmentIndex] = []  # oldest first; the last one takes appends
        self.next_offset = 1
        self.first_offset = 1  # of the oldest record present, or next_offset when empty
        self.bytes_used = 0  # the segment files' sizes, those being unlinked included
        self.unlinking_bytes = 0  # of segments handed to the reaper and still on disk
        self.visible = 0  # readers see offsets up to here
        self._quarantine = directory / QUARANTINE_DIR
        self._commits = GroupCommit(directory, fsync_always=fsync_always, counters=counters,
                                    position=self._durable_position, on_synced=self._publish)
        # what readers that keep up read, instead of the files
        self._recent = RecentRecords(recent_bytes, RECORD_OVERHEAD)

    # -- recovery --------------------------------------------------------------------------

    def recover(self, min_next_offset: int, marks: DedupeMarks) -> Recovered:
        """Check every segment, repair what is damaged, open the last one for appending."""
        paths = sorted(p for p in self.directory.iterdir() if parse_segment_name(p.name))
        total, prev = Recovered(None), 0
        hint = min_next_offset
        for i, path in enumerate(paths):
            is_last = i == len(paths) - 1
            hint = max(hint, parse_segment_name(path.name) or 0)
            found = recover_segment(path, prev_offset=prev, is_last=is_last,
                                    quarantine=self._quarantine)
            _add_up(total, found)
            self._on_recovered(found)
            if found.index is None:
                continue
            hint = max(hint, found.index.first_offset)
            if found.index.records == 0 and not is_last:
                path.unlink()
                continue
            self.segments.append(found.index)
            marks.merge(found.sessions)
            prev = max(prev, found.index.last_offset)
        self.next_offset = max(prev + 1, hint)
        self._open_active()
        self.bytes_used = sum(s.size for s in self.segments)
        self._refresh_first_offset()
        self.visible = self._commits.synced = self.next_offset - 1
        prune_quarantine(self._quarantine, QUARANTINE_KEEP)
        return total

    def _open_active(self) -> None:
        last = self.segments[-1] if self.segments else None
        if last is not None:
            resumes_at = last.last_offset + 1 if last.records else last.first_offset
            if last.version == FORMAT_VERSION and resumes_at == self.next_offset:
                last.fd = open_for_append(last.path)
                return
            if last.records == 0:
                last.path.unlink()
                self.segments.pop()
        self._start_segment()

    # -- appending -------------------------------------------------------------------------

    def room_needed(self, size: int) -> int:
        """Bytes an append of a `size`-byte frame adds, including a new segment's header."""
        return size + (HEADER_SIZE if self.must_roll(size) else 0)

    def must_roll(self, size: int) -> bool:
        active = self.segments[-1]
        return active.fd is None or (active.records > 0 and active.size + size > self.segment_bytes)

    def write(self, payload: bytes, count: int, received_ns: int, session: bytes, seq: int) -> int:
        size = RECORD_OVERHEAD + len(payload)
        if self.must_roll(size):
            self.roll()
        active = self.segments[-1]
        assert active.fd is not None
        offset, position = self.next_offset, active.size
        head = record_head(offset, session, seq, received_ns, count, payload)
        try:
            write_frame(active.fd, head, payload, position)
        except TornWriteError:
            self._commits.seal(active.path, active.fd)  # the next append starts afresh
            active.fd = None
            raise
        active.add(offset, position, count, position + size)
        self._recent.add(SpoolRecord(offset, session, seq, received_ns, count, payload))
        self.next_offset = offset + 1
        self.bytes_used += size
        if not self.fsync_always:
            self._publish(offset)
        return offset

    def roll(self) -> None:
        old = self.segments[-1]
        if old.fd is not None:
            self._commits.seal(old.path, old.fd)
            old.fd = None
        if old.records == 0:  # only after a failed first write: nothing in it to keep
            old.path.unlink(missing_ok=True)
            self.segments.pop()
            self.bytes_used -= old.size
        self._start_segment()
        self._commits.in_background()

    def _start_segment(self) -> None:
        try:
            path, fd = create_segment(self.directory, self.next_offset, SCHEMA_VERSION)
        except OSError:
            # A full disk: an empty stand-in takes the place, so there is always an active
            # segment, and the next write() rolls again (must_roll: it has no fd).
            stand_in = self.directory / segment_name(self.next_offset)
            self.segments.append(SegmentIndex(stand_in, self.next_offset, FORMAT_VERSION, 0))
            raise
        index = SegmentIndex(path, self.next_offset, FORMAT_VERSION, HEADER_SIZE)
        index.fd = fd
        self.segments.append(index)
        self.bytes_used += HEADER_SIZE
        self._commits.directory_changed()

    def _publish(self, offset: int) -> None:
        self.visible = offset
        self._on_visible(offset)

    # -- deleting --------------------------------------------------------------------------

    def first_offset_after(self, count: int) -> int:
        """What first_offset becomes once the `count` oldest segments are gone."""
        rest = self.segments[count:]
        return next((s.offsets[0] for s in rest if s.records), self.next_offset)

    def remove_oldest(self, count: int, *, background: bool = False) -> list[SegmentIndex]:
        """Delete the `count` oldest segments (never the active one). With `background`
        and a running event loop the unlinks go to the reaper's thread; their bytes stay
        in `bytes_used` until each unlink has happened (`settle`)."""
        count = min(count, len(self.segments) - 1)
        victims = self.segments[:count]
        self.first_offset = self.first_offset_after(count)
        self._commits.forget({s.path for s in victims})
        loop = _running_loop() if background and victims else None
        if loop is None:
            for segment in victims:
                self._unlink(segment.path)
        del self.segments[:count]
        freed = sum(s.size for s in victims)
        if loop is None:
            self.bytes_used -= freed
            self.counters.segments_deleted += count
        else:
            self.settle()
            self.unlinking_bytes += freed
            self._reaper.submit([Doomed(s.path, s.size) for s in victims], loop, self.settle)
        return victims

    def remove_all(self) -> None:
        """Delete every segment, the one taking appends too, and start an empty one at
        next_offset. For a full disk whose every record all sinks have passed: on a disk
        smaller than one segment, the segment taking appends holds all the space there is
        to free, and it never fills up to roll. Inline, not in the reaper: the caller
        needs the space at once. If the new segment's header finds no room either, an
        empty stand-in takes its place and the next write tries again."""
        self.remove_oldest(len(self.segments) - 1)
        active = self.segments.pop()
        self._commits.forget({active.path})
        if active.fd is not None:
            self._commits.discard_active(active.fd)
            active.fd = None
        self._unlink(active.path)
        self.bytes_used -= active.size
        if active.size:  # a stand-in (size 0) was never a file
            self.counters.segments_deleted += 1
        self._recent.clear()
        self.first_offset = self.next_offset
        self._commits.directory_changed()
        with contextlib.suppress(OSError):  # the stand-in is in place: the next write rolls
            self._start_segment()

    def settle(self) -> None:
        """On the loop: count what the reaper has unlinked (or failed to) since last time."""
        freed = 0
        for reaped in self._reaper.take_done():
            if reaped.error is None:
                freed += reaped.doomed.size
                self.counters.segments_deleted += 1
                continue
            self.counters.count_unlink_error(reaped.error)
            if reaped.error not in self._unlink_errors_logged:
                self._unlink_errors_logged.add(reaped.error)
                log.warning("spool: unlinking collected segment %s failed (%s); its space "
                            "stays counted and the unlink is retried", reaped.doomed.path.name,
                            reaped.error)
        if freed:
            self.bytes_used -= freed
            self.unlinking_bytes -= freed
        settled, self._settled = self._settled, None
        if settled is not None and not settled.done():
            settled.set_result(None)
        if freed:
            self._on_freed()

    def unlinks_pending(self) -> bool:
        return self._reaper.busy()

    async def unlinked(self, timeout: float) -> bool:
        """Wait until every unlink handed to the reaper has run; False after `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.settle()
            if not self._reaper.busy():
                self.settle()
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._settled is None or self._settled.get_loop() is not loop:
                self._settled = loop.create_future()
            try:
                async with asyncio.timeout(min(remaining, 0.1)):  # 0.1: a missed wake-up
                    await asyncio.shield(self._settled)
            except TimeoutError:
                continue

    def wait_unlinked(self, timeout: float) -> bool:
        """Block until every unlink handed to the reaper has run (a full disk's commit:
        the cursor file needs the space they free); False after `timeout`."""
        idle = self._reaper.wait_idle(timeout)
        self.settle()
        return idle

    def pending_from(self, start: int) -> tuple[int, int]:
        """(records, events) with an offset >= start."""
        records = events = 0
        for segment in self.segments:
            if segment.last_offset >= start:
                i = segment.find(start)
                records += segment.records - i
                events += segment.events_from(i)
        return records, events

    def _refresh_first_offset(self) -> None:
        self.first_offset = self.first_offset_after(0)

    # -- reading ---------------------------------------------------------------------------

    def read(self, start: int, max_bytes: int, max_records: int) -> list[SpoolRecord]:
        for _ in range(3):
            try:
                return self._read(start, max_bytes, max(1, max_records))
            except _Damaged as damaged:
                self._repair(damaged.segment)
        log.error("spool: a segment stays unreadable after repair")
        return []

    def _read(self, start: int, max_bytes: int, max_records: int) -> list[SpoolRecord]:
        out: list[SpoolRecord] = []
        start = max(start, self.first_offset)
        recent = self._recent.read(start, self.visible, max_bytes, max_records)
        if recent is not None:
            return recent
        budget = max_bytes
        for segment in self.segments:
            if segment.last_offset < start:
                continue
            got, used, whole = self._read_segment(segment, start, budget,
                                                  max_records - len(out), not out)
            out.extend(got)
            budget -= used
            if not whole or budget <= 0 or len(out) >= max_records:
                break
            start = segment.last_offset + 1
        return out

    def _read_segment(self, segment: SegmentIndex, start: int, budget: int, max_records: int,
                      first: bool) -> tuple[list[SpoolRecord], int, bool]:
        """(records, bytes read, whether the rest of the segment was read)."""
        i = j = segment.find(start)
        limit = min(segment.records, i + max_records)
        used = 0
        while j < limit and segment.offsets[j] <= self.visible:
            frame = segment.end_of(j) - segment.positions[j]
            if used + frame > budget and (j > i or not first):
                break
            used += frame
            j += 1
        if j == i:
            return [], 0, i == segment.records
        with open(segment.path, "rb") as f:
            f.seek(segment.positions[i])
            data = f.read(used)
        records, intact = decode_records(data, start)
        if not intact or len(records) != j - i:
            raise _Damaged(segment)
        return records, used, j == segment.records

    def _repair(self, segment: SegmentIndex) -> None:
        """A record failed its checksum on read: recover that segment as at start-up."""
        self._recent.clear()  # readers go by what the repaired files hold
        if segment is self.segments[-1]:
            self.roll()
        i = self.segments.index(segment)
        prev = max((s.last_offset for s in self.segments[:i]), default=0)
        found = recover_segment(segment.path, prev_offset=prev, is_last=False,
                                quarantine=self._quarantine)
        self._on_recovered(found)
        if found.index is None or found.index.records == 0:
            segment.path.unlink(missing_ok=True)
            del self.segments[i]
        else:
            self.segments[i] = found.index
        self.bytes_used += (found.index.size if found.index else 0) - segment.size
        self._refresh_first_offset()
        prune_quarantine(self._quarantine, QUARANTINE_KEEP)

    # -- durability ------------------------------------------------------------------------

    async def sync_through(self, offset: int) -> None:
        """Return once `offset` is fsynced; appends arriving meanwhile share the next fsync."""
        await self._commits.through(offset)

    def _durable_position(self) -> tuple[int | None, int]:
        return (self.segments[-1].fd if self.fsync_always else None), self.next_offset - 1

    def close(self) -> None:
        """Fsync and close every file; waits for a running fsync thread, and up to
        CLOSE_WAIT_S for queued unlinks (what is left, the next start collects)."""
        left = self._reaper.stop(CLOSE_WAIT_S)
        self.settle()
        if left:
            log.info("spool: %d segment unlinks left for the next start to collect", left)
        active = self.segments[-1].fd if self.segments else None
        if self.segments:
            self.segments[-1].fd = None
        self._commits.close(active, self.next_offset - 1)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # called outside the event loop: nothing to keep free, unlink here
        return None


def _add_up(total: Recovered, found: Recovered) -> None:
    total.truncated_bytes += found.truncated_bytes
    total.corrupt_records += found.corrupt_records
    total.lost_events += found.lost_events
    total.quarantined += found.quarantined

