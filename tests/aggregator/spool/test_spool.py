"""The spool on real files: round trips, restarts, damage on disk, byte caps, cursors, fsync."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.spool import Spool, SpoolClosed, SpoolLockedError, SpoolVersionError
from aggregator.spool._segment import HEADER_SIZE, RECORD_OVERHEAD
from tests.aggregator.spool.records import (
    FRAME,
    SEGMENT,
    SESSION,
    fill,
    on_disk,
    payload,
    run,
    segments,
)


def opened(directory: Path, **kwargs: Any) -> Spool:
    kwargs.setdefault("max_bytes", 1 << 20)
    kwargs.setdefault("segment_bytes", SEGMENT)
    spool = Spool(directory, **kwargs)
    spool.open()
    return spool


async def collected(spool: Spool, directory: Path) -> None:
    """The unlinks of collected segments run in a thread: until each has happened its
    bytes stay counted (never fewer than on disk); once all have, the count is exact."""
    assert spool.bytes_used >= on_disk(directory)
    assert await spool.collected(timeout=10)
    assert spool.bytes_used == on_disk(directory)


def quarantined(directory: Path) -> list[Path]:
    return sorted((directory / "quarantine").glob("*.corrupt"))


def flip(path: Path, position: int, length: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        data = f.read(length)
        f.seek(position)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.fixture
def spool_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "spool"


# -- round trips and restarts -------------------------------------------------------------


def test_round_trip_across_several_segments(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        offsets = await fill(spool, 30)
        assert offsets == list(range(1, 31))
        assert len(segments(spool_dir)) == 8
        records = spool.read(1)
        assert [r.offset for r in records] == offsets
        assert [r.payload for r in records] == [payload(i) for i in range(30)]
        assert [r.count for r in records] == [i % 7 + 1 for i in range(30)]
        assert [r.received_ns for r in records] == list(range(30))
        assert [r.offset for r in spool.read(11, max_records=6)] == list(range(11, 17))
        assert [r.offset for r in spool.read(5, max_bytes=2 * FRAME)] == [5, 6]
        assert [r.offset for r in spool.read(5, max_bytes=1)] == [5]  # at least one
        assert spool.read(31) == []
        assert spool.lag("new") == (30, sum(i % 7 + 1 for i in range(30)))
        assert spool.bytes_used == sum(p.stat().st_size for p in segments(spool_dir))
        spool.close()

    run(scenario())


def test_restart_keeps_offsets_cursors_dedupe_and_id(spool_dir: Path) -> None:
    async def first_run() -> str:
        spool = opened(spool_dir)
        await fill(spool, 10, seq=True)
        spool.register_sinks(["lake"])
        spool.commit("lake", 6)
        spool.close()
        return spool.spool_id

    async def second_run(spool_id: str) -> None:
        spool = opened(spool_dir)
        assert spool.spool_id == spool_id and len(spool_id) == 32
        assert spool.next_offset == 11
        assert spool.cursor("lake") == 6
        assert spool.has(SESSION, 10) and not spool.has(SESSION, 11)
        again = await spool.append(payload(3), 1, received_ns=0, session=SESSION, seq=4)
        assert again.duplicate and again.offset is None
        fresh = await spool.append(payload(11), 1, received_ns=0, session=SESSION, seq=11)
        assert fresh.offset == 11
        assert [r.offset for r in spool.read(spool.cursor("lake"))] == list(range(6, 12))
        assert spool.counters.duplicates == 1
        spool.close()

    run(second_run(run(first_run())))


def test_dedupe_survives_deletion_of_the_segments_that_held_it(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        idle = bytes(15) + b"\x09"  # last heard from long before the marks' time to live
        await spool.append(payload(0), 1, received_ns=1, session=idle, seq=1)  # offset 1
        for seq in range(1, 12):  # offsets 2-12
            await spool.append(payload(seq), 1, received_ns=time.time_ns(), session=SESSION,
                               seq=seq)
        await fill(spool, 4)  # 13-16, without a session
        spool.register_sinks(["lake"])
        spool.commit("lake", 17)  # the segments of 1-12 go; only the marks file remembers
        assert spool.first_offset == 13 and (spool_dir / "sessions.marks").exists()
        assert not spool.has(idle, 1)
        spool.close()
        spool = opened(spool_dir)
        assert spool.has(SESSION, 11) and not spool.has(SESSION, 12)
        assert not spool.has(idle, 1)
        spool.close()

    run(scenario())


def test_second_agent_on_the_same_directory_is_refused(spool_dir: Path) -> None:
    spool = opened(spool_dir)
    with pytest.raises(SpoolLockedError):
        opened(spool_dir)
    spool.close()
    opened(spool_dir).close()


# -- damage on disk -----------------------------------------------------------------------


def test_torn_tail_is_truncated_and_counted(spool_dir: Path) -> None:
    run(_fill_and_close(spool_dir, 6))
    last = segments(spool_dir)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 100)  # the last record lost its end
    spool = opened(spool_dir)
    report_records = [r.offset for r in spool.read(1)]
    assert report_records == [1, 2, 3, 4, 5]
    assert spool.counters.truncated_bytes == FRAME - 100
    assert last.stat().st_size == size - FRAME
    assert spool.next_offset == 6 and quarantined(spool_dir) == []
    assert run(spool.append(b"x", 1, received_ns=0)).offset == 6
    spool.close()


@pytest.mark.parametrize("garbage", [b"\xff" * 37, bytes(300), b"\x00\x00\x01", os.urandom(5000)])
def test_garbage_after_the_last_record_is_truncated(spool_dir: Path, garbage: bytes) -> None:
    run(_fill_and_close(spool_dir, 6))
    with open(segments(spool_dir)[-1], "ab") as f:
        f.write(garbage)
    spool = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=SEGMENT)
    report = spool.open()
    assert report.truncated_bytes == len(garbage)
    assert report.corrupt_records == 0 and report.records == 6
    assert [r.offset for r in spool.read(1)] == [1, 2, 3, 4, 5, 6]
    spool.close()


def test_a_crash_while_creating_a_segment_leaves_nothing_behind(spool_dir: Path) -> None:
    run(_fill_and_close(spool_dir, 4))
    (spool_dir / "00000000000000000005.seg").write_bytes(b"EVAG")  # header never finished
    spool = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=SEGMENT)
    report = spool.open()
    assert report.truncated_bytes == 4 and spool.next_offset == 5
    assert run(spool.append(b"x", 1, received_ns=0)).offset == 5
    spool.close()


def test_a_flipped_payload_loses_only_that_record(spool_dir: Path) -> None:
    run(_fill_and_close(spool_dir, 12))
    first = segments(spool_dir)[0]
    flip(first, HEADER_SIZE + FRAME + RECORD_OVERHEAD + 200)  # inside record 2's payload
    spool = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=SEGMENT)
    report = spool.open()
    assert report.corrupt_records == 1 and len(report.quarantined_files) == 1
    assert [r.offset for r in spool.read(1)] == [1, *range(3, 13)]
    assert spool.losses.totals() == {"corrupt_record": 2}  # record 2 carried 1 % 7 + 1 events
    assert spool.losses.take_unreported() == {"corrupt_record": 2}
    assert spool.losses.take_unreported() == {}
    assert Path(report.quarantined_files[0]).stat().st_size == SEGMENT  # the original, whole
    spool.close()
    spool = opened(spool_dir)  # the repair holds: nothing found the second time
    assert spool.counters.corrupt_records == 0 and len(spool.read(1)) == 11
    spool.close()


def test_a_broken_length_quarantines_the_rest_of_its_segment(spool_dir: Path) -> None:
    run(_fill_and_close(spool_dir, 12))  # segments hold 1-4, 5-8, 9-12
    middle = segments(spool_dir)[1]
    flip(middle, HEADER_SIZE + FRAME, 2)  # record 6's length now points nowhere sensible
    spool = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=SEGMENT)
    report = spool.open()
    assert report.corrupt_records == 1 and len(quarantined(spool_dir)) == 1
    assert [r.offset for r in spool.read(1)] == [1, 2, 3, 4, 5, 9, 10, 11, 12]
    assert spool.lag("any") == (9, sum(i % 7 + 1 for i in (0, 1, 2, 3, 4, 8, 9, 10, 11)))
    assert spool.next_offset == 13
    spool.close()


def test_a_segment_with_a_damaged_header_is_moved_aside(spool_dir: Path) -> None:
    run(_fill_and_close(spool_dir, 12))
    flip(segments(spool_dir)[0], 9, 1)  # the format version: the header CRC catches it
    spool = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=SEGMENT)
    report = spool.open()
    assert report.corrupt_records == 1 and report.records == 8
    assert spool.first_offset == 5 and len(quarantined(spool_dir)) == 1
    spool.close()


def test_a_segment_from_a_newer_format_is_refused_not_destroyed(spool_dir: Path) -> None:
    run(_fill_and_close(spool_dir, 2))
    path = segments(spool_dir)[0]
    data = bytearray(path.read_bytes())
    data[8:10] = (2).to_bytes(2, "big")
    data[28:32] = struct.pack(">I", zlib.crc32(bytes(data[:28])))
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolVersionError):
        Spool(spool_dir, max_bytes=1 << 20).open()
    assert path.read_bytes() == bytes(data)
    opened_again = Spool(spool_dir, max_bytes=1 << 20)  # the lock was released
    with pytest.raises(SpoolVersionError):
        opened_again.open()


def test_damage_found_while_reading_is_repaired_once(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, recent_bytes=0)  # every read from the files
        await fill(spool, 12)
        flip(segments(spool_dir)[0], HEADER_SIZE + 2 * FRAME + RECORD_OVERHEAD + 10)
        assert [r.offset for r in spool.read(1)] == [1, 2, *range(4, 13)]
        assert spool.counters.corrupt_records == 1 and len(quarantined(spool_dir)) == 1
        assert spool.losses.take_unreported() == {"corrupt_record": 3}
        flip(segments(spool_dir)[-1], HEADER_SIZE + RECORD_OVERHEAD + 10)  # the active one
        assert [r.offset for r in spool.read(9)] == [10, 11, 12]
        assert (await spool.append(b"x", 1, received_ns=0)).offset == 13
        assert [r.offset for r in spool.read(12)] == [12, 13]
        middle = segments(spool_dir)[1]
        os.truncate(middle, middle.stat().st_size - FRAME - 5)  # cut inside record 7
        assert [r.offset for r in spool.read(5)] == [5, 6, 10, 11, 12, 13]
        assert spool.counters.corrupt_records == 3 and len(quarantined(spool_dir)) == 3
        spool.close()

    run(scenario())


def test_unreadable_cursor_and_marks_files_are_ignored(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        await fill(spool, 8, seq=True)
        spool.register_sinks(["lake"])
        spool.commit("lake", 7)
        spool.close()

    run(scenario())
    (spool_dir / "cursors" / "lake.json").write_bytes(b"{not json")
    (spool_dir / "sessions.marks").write_bytes(b"EVAGGSES garbage")
    spool = opened(spool_dir)
    assert spool.cursor("lake") == spool.first_offset == 5
    assert spool.has(SESSION, 8)  # the segments still hold the marks
    spool.close()


# -- the byte cap -------------------------------------------------------------------------


def test_block_waits_for_a_commit_and_keeps_arrival_order(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=4 * SEGMENT, segment_bytes=SEGMENT)
        spool.register_sinks(["lake"])
        await fill(spool, 16)
        assert spool.bytes_used + FRAME + HEADER_SIZE > spool.max_bytes
        first = asyncio.create_task(spool.append(payload(100), 5, received_ns=0))
        second = asyncio.create_task(spool.append(b"small", 1, received_ns=0))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not first.done() and not second.done()
        assert spool.counters.full_waits == 2
        spool.commit("lake", 5)  # frees the first segment
        done = await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
        assert [r.offset for r in done] == [17, 18]
        assert spool.bytes_used <= spool.max_bytes and spool.losses.totals() == {}
        spool.close()

    run(scenario())


def test_close_releases_appends_that_wait_for_room(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=4 * SEGMENT, segment_bytes=SEGMENT)
        spool.register_sinks(["lake"])
        await fill(spool, 16)
        waiting = asyncio.create_task(spool.append(payload(100), 5, received_ns=0))
        await asyncio.sleep(0)
        spool.close()
        with pytest.raises(SpoolClosed):
            await asyncio.wait_for(waiting, timeout=10)

    run(scenario())


def test_drop_oldest_drops_advances_cursors_and_counts_exactly(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=4 * SEGMENT, segment_bytes=SEGMENT,
                       when_full="drop_oldest")
        spool.register_sinks(["lake", "archive"])
        await fill(spool, 12)
        spool.commit("lake", 3)  # lake delivered 1-2; archive nothing
        spool.commit("archive", 2)
        await fill(spool, 9, start=12)  # 13-21: the segments of 1-4 and 5-8 must go
        assert spool.first_offset == 9
        dropped_events = sum(i % 7 + 1 for i in range(1, 8))  # offsets 2-8: not all delivered
        assert spool.losses.totals() == {"drop_oldest": dropped_events}
        assert spool.counters.dropped_records == 7
        assert spool.cursor("lake") == spool.cursor("archive") == 9
        assert [r.offset for r in spool.read(spool.cursor("lake"))] == list(range(9, 22))
        assert spool.lag("lake") == (13, sum(i % 7 + 1 for i in range(8, 21)))
        assert spool.bytes_used <= spool.max_bytes
        assert spool.losses.take_unreported() == {"drop_oldest": dropped_events}
        assert spool.losses.take_unreported() == {}
        spool.close()

    run(scenario())


def test_drop_oldest_without_sinks_counts_every_dropped_event(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=4 * SEGMENT, segment_bytes=SEGMENT,
                       when_full="drop_oldest")
        await fill(spool, 17)
        assert spool.losses.totals() == {"drop_oldest": sum(i % 7 + 1 for i in range(4))}
        spool.close()

    run(scenario())


def test_oversized_and_malformed_records_are_refused(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=4 * SEGMENT, segment_bytes=1 << 20)
        with pytest.raises(ValueError, match="exceeds"):
            await spool.append(bytes(spool.max_record_bytes + 1), 1, received_ns=0)
        with pytest.raises(ValueError, match="session"):
            await spool.append(b"x", 1, received_ns=0, session=b"short", seq=1)
        with pytest.raises(ValueError, match="range"):
            await spool.append(b"x", -1, received_ns=0)
        assert (await spool.append(bytes(spool.max_record_bytes), 1, received_ns=0)).offset == 1
        with pytest.raises(ValueError, match="beyond"):
            spool.commit("lake", 3)
        spool.close()
        with pytest.raises(SpoolClosed):
            spool.read(1)

    run(scenario())


def test_a_failed_write_leaves_no_partial_record(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        await fill(spool, 2)
        active = segments(spool_dir)[-1]
        size = active.stat().st_size
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
        try:
            with pytest.raises(OSError):
                await spool.append(payload(7), 1, received_ns=0)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous)
        assert active.stat().st_size == size
        assert (await spool.append(payload(8), 1, received_ns=0)).offset == 3
        spool.close()
        spool = opened(spool_dir)
        assert spool.counters.truncated_bytes == 0
        assert [r.payload for r in spool.read(1)] == [payload(0), payload(1), payload(8)]
        spool.close()

    run(scenario())


# -- cursors ------------------------------------------------------------------------------


def test_a_slow_sink_pins_segments_while_the_fast_one_advances(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        spool.register_sinks(["fast", "slow"])
        await fill(spool, 12)
        spool.commit("fast", 13)
        assert len(segments(spool_dir)) == 3 and spool.first_offset == 1
        assert spool.lag("fast") == (0, 0) and spool.lag("slow")[0] == 12
        spool.commit("slow", 6)
        assert spool.first_offset == 5
        await collected(spool, spool_dir)
        assert len(segments(spool_dir)) == 2
        assert spool.counters.segments_deleted == 1
        spool.commit("slow", 13)  # the active segment stays, though everyone passed it
        assert spool.first_offset == 9
        await collected(spool, spool_dir)
        assert len(segments(spool_dir)) == 1
        assert spool.lag("slow") == (0, 0) and spool.cursor("newcomer") == 9
        spool.close()

    run(scenario())


def test_a_sink_no_longer_configured_stops_pinning(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        spool.register_sinks(["fast", "gone"])
        await fill(spool, 12)
        spool.commit("fast", 13)
        spool.commit("gone", 2)
        assert len(segments(spool_dir)) == 3
        spool.register_sinks(["fast"])
        await collected(spool, spool_dir)
        assert len(segments(spool_dir)) == 1
        assert (spool_dir / "cursors" / "gone.json").exists()
        spool.close()
        spool = opened(spool_dir)  # before register_sinks, every known cursor pins
        assert spool.cursor("gone") == spool.first_offset == 9
        spool.close()

    run(scenario())


def test_a_new_sink_starts_at_the_oldest_record_and_pins_it(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        spool.register_sinks(["old"])
        await fill(spool, 12)
        spool.commit("old", 9)
        spool.register_sinks(["old", "new"])
        assert spool.cursor("new") == 9
        spool.commit("old", 13)
        assert spool.first_offset == 9
        spool.commit("new", 8)  # behind its cursor: ignored
        assert spool.cursor("new") == 9 and not (spool_dir / "cursors" / "new.json").exists()
        spool.close()

    run(scenario())


def test_wait_for_wakes_on_append_and_times_out(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir)
        assert not await spool.wait_for(1, 0.01)
        waiter = asyncio.create_task(spool.wait_for(1, 30))
        await asyncio.sleep(0)
        await spool.append(b"x", 1, received_ns=0)
        assert await asyncio.wait_for(waiter, timeout=10)
        assert await spool.wait_for(1, 0)
        spool.close()
        assert not await spool.wait_for(5, 1)

    run(scenario())


# -- fsync ---------------------------------------------------------------------------------


def test_fsync_always_shares_fsyncs_among_concurrent_appends(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, fsync="always", segment_bytes=64 * FRAME)
        results = await asyncio.gather(
            *(spool.append(payload(i), 1, received_ns=i) for i in range(200))
        )
        assert sorted(r.offset or 0 for r in results) == list(range(1, 201))
        assert 0 < spool.counters.fsyncs < 200
        assert len(spool.read(1, max_records=500)) == 200
        spool.close()

    run(scenario())


def test_fsync_failure_fails_the_append_and_is_counted(
    spool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, fsync="always")
        await spool.append(b"ok", 1, received_ns=0)

        def broken(fd: int) -> None:
            raise OSError(5, "Input/output error")

        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", broken)
            with pytest.raises(OSError, match="Input/output"):
                await spool.append(b"lost?", 1, received_ns=0)
        assert spool.counters.fsync_errors == 1
        assert (await spool.append(b"again", 1, received_ns=0)).offset == 3
        assert [r.payload for r in spool.read(1)] == [b"ok", b"lost?", b"again"]
        spool.close()

    run(scenario())


_CHILD = """
import asyncio, sys
from pathlib import Path
from aggregator.spool import Spool

async def main():
    spool = Spool(Path(sys.argv[1]), max_bytes=1 << 30, segment_bytes=64 * 1024)
    spool.open()
    seq = 0
    while True:
        seq += 1
        result = await spool.append(bytes([seq % 251]) * 3000, 2, received_ns=seq,
                                    session=bytes(range(1, 17)), seq=seq)
        print(seq, result.offset, flush=True)

asyncio.run(main())
"""


def test_an_agent_killed_mid_stream_keeps_every_acknowledged_record(spool_dir: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(spool_dir)], cwd=root,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked: list[tuple[int, int]] = []
    try:
        for line in child.stdout:
            seq, offset = map(int, line.split())
            acked.append((seq, offset))
            if len(acked) == 300:
                break
    finally:
        child.kill()
        child.wait()
    spool = Spool(spool_dir, max_bytes=1 << 30, segment_bytes=64 * 1024)
    report = spool.open()
    # The kill may land inside the write of a record nobody was told about yet: that torn
    # tail is cut; what matters is that every acknowledged record is whole.
    assert report.corrupt_records == 0
    records = {r.offset: r for r in spool.read(1, max_records=100_000)}
    assert sorted(records) == list(range(1, len(records) + 1))
    for seq, offset in acked:
        assert records[offset].seq == seq and records[offset].payload == bytes([seq % 251]) * 3000
    assert spool.has(bytes(range(1, 17)), len(records))
    assert run(spool.append(b"x", 1, received_ns=0)).offset == len(records) + 1
    spool.close()


async def _fill_and_close(directory: Path, n: int) -> None:
    spool = opened(directory)
    await fill(spool, n)
    spool.close()


# -- random histories ----------------------------------------------------------------------

Op = tuple[str, int, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 6), st.integers(0, 3)),
        st.tuples(st.just("resend"), st.integers(1, 4), st.integers(0, 3)),
        st.tuples(st.just("deliver"), st.integers(0, 1), st.integers(1, 8)),
        st.tuples(st.just("restart"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_histories_never_lose_or_repeat_a_record(history: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run(_replay(Path(tmp) / "spool", history))


async def _replay(directory: Path, history: list[Op]) -> None:
    sinks = ("a", "b")
    stored: dict[int, bytes] = {}  # offset -> payload of every record ever accepted
    sent = [0, 0, 0, 0]  # last seq sent per producer session

    def make() -> Spool:
        return opened(directory, segment_bytes=HEADER_SIZE + 3 * 80)

    spool = make()
    spool.register_sinks(sinks)
    for op, x, y in history:
        if op == "append":
            for _ in range(x):
                sent[y] += 1
                body = f"{y}:{sent[y]}".encode()
                result = await spool.append(body, 1, received_ns=time.time_ns(),
                                            session=bytes([y + 1]) * 16, seq=sent[y])
                assert result.offset is not None and result.offset not in stored
                stored[result.offset] = body
        elif op == "resend":
            for seq in range(max(1, sent[y] - x + 1), sent[y] + 1):
                again = await spool.append(b"dup", 1, received_ns=time.time_ns(),
                                           session=bytes([y + 1]) * 16, seq=seq)
                assert again.duplicate
        elif op == "deliver":
            sink = sinks[x]
            records = spool.read(spool.cursor(sink), max_records=y)
            if records:
                spool.commit(sink, records[-1].offset + 1)
        else:
            spool.close()
            spool = make()
            spool.register_sinks(sinks)
        for sink in sinks:
            cursor = spool.cursor(sink)
            got = spool.read(cursor, max_records=10_000)
            assert [(r.offset, r.payload) for r in got] == sorted(
                (o, p) for o, p in stored.items() if o >= cursor
            )
    spool.close()


damage = st.lists(
    st.tuples(st.sampled_from(["flip", "cut", "garbage"]), st.integers(0, 2),
              st.integers(0, SEGMENT - 1), st.binary(min_size=1, max_size=80)),
    min_size=1,
    max_size=3,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage)
def test_random_damage_never_breaks_recovery(harm: list[tuple[str, int, int, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "spool"
        run(_fill_and_close(directory, 12))  # three full segments
        for kind, which, position, junk in harm:
            path = segments(directory)[min(which, len(segments(directory)) - 1)]
            size = path.stat().st_size
            if kind == "flip" and size:
                flip(path, min(position, size - 1), 1)
            elif kind == "cut":
                os.truncate(path, min(position, size))
            elif kind == "garbage":
                with open(path, "ab") as f:
                    f.write(junk)
        spool = opened(directory)
        records = spool.read(1, max_records=100)
        assert all(r.payload == payload(r.offset - 1) for r in records)
        assert [r.offset for r in records] == sorted({r.offset for r in records})
        spool.close()
        again = Spool(directory, max_bytes=1 << 20, segment_bytes=SEGMENT)
        report = again.open()  # one repair is enough
        assert (report.truncated_bytes, report.corrupt_records) == (0, 0)
        assert [r.offset for r in again.read(1, max_records=100)] == [r.offset for r in records]
        assert run(again.append(b"x", 1, received_ns=0)).offset == again.next_offset - 1
        assert again.next_offset - 1 > max((r.offset for r in records), default=0)
        again.close()


def test_commit_on_a_full_disk_frees_delivered_segments_first(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No space for the cursor file must not deadlock delivery: the delivered segments go
    first (deleting needs no space), then the cursor is written."""
    import errno

    import aggregator.spool._cursors as spool_module

    spool = opened(spool_dir)
    spool.register_sinks(["lake"])
    run(fill(spool, 12, seq=True))
    before = len(segments(spool_dir))
    real_write = spool_module.write_cursor
    calls: list[int] = []

    def full_until_freed(directory: Path, sink: str, next_offset: int) -> None:
        calls.append(next_offset)
        if len(segments(spool_dir)) == before:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(directory, sink, next_offset)

    monkeypatch.setattr(spool_module, "write_cursor", full_until_freed)
    spool.commit("lake", 10)
    assert len(calls) == 2 and len(segments(spool_dir)) < before
    assert spool.counters.enospc_commits == 1
    spool.close()
    monkeypatch.undo()
    again = opened(spool_dir)
    assert again.cursor("lake") == 10
    assert [r.offset for r in again.read(again.cursor("lake"))] == [10, 11, 12]
    again.close()


# -- a full disk whose every record is delivered ----------------------------------------


def disk_full_while(monkeypatch: pytest.MonkeyPatch, holds: Path,
                    module: str = "write_frame") -> None:
    """Writes fail with ENOSPC while the file `holds` is on disk (what fills the disk)."""
    import errno

    import aggregator.spool._log as log_module

    real = getattr(log_module, module)

    def full(*args: Any) -> Any:
        if holds.exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(log_module, module, full)


@pytest.mark.parametrize("fsync", ["os", "always"])
def test_a_full_disk_frees_the_segment_being_written_once_all_is_delivered(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch, fsync: str) -> None:
    """A disk smaller than one segment: the segment being written never rolls, so only
    deleting it too frees the space its delivered records hold."""
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=1 << 24, segment_bytes=1 << 22, fsync=fsync)
        spool.register_sinks(["lake"])
        await fill(spool, 3, seq=True)
        (only,) = segments(spool_dir)
        spool.commit("lake", 4)
        disk_full_while(monkeypatch, only)
        result = await spool.append(payload(9), 1, received_ns=9, session=SESSION, seq=9)
        assert result.offset == 4 and not only.exists()
        assert [p.name for p in segments(spool_dir)] == [f"{4:020d}.seg"]
        assert (await spool.append(payload(0), 1, received_ns=0, session=SESSION,
                                   seq=1)).duplicate  # a resend of a deleted record
        assert [r.offset for r in spool.read(spool.cursor("lake"))] == [4]
        assert spool.counters.segments_deleted == 1 and spool.counters.fsync_errors == 0
        spool.close()
        again = opened(spool_dir, max_bytes=1 << 24, segment_bytes=1 << 22)
        assert [r.payload for r in again.read(again.cursor("lake"))] == [payload(9)]
        again.close()

    run(scenario())


def test_a_full_disk_keeps_records_a_sink_still_needs(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=1 << 24, segment_bytes=1 << 22)
        spool.register_sinks(["lake", "slow"])
        await fill(spool, 3)
        (only,) = segments(spool_dir)
        spool.commit("lake", 4)
        disk_full_while(monkeypatch, only)
        with pytest.raises(OSError):
            await spool.append(payload(9), 1, received_ns=9)
        assert only.exists()
        assert [r.offset for r in spool.read(spool.cursor("slow"))] == [1, 2, 3]
        spool.close()

    run(scenario())


def test_no_room_even_for_a_new_segment_header_is_tried_again(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    async def scenario() -> None:
        spool = opened(spool_dir, max_bytes=1 << 24, segment_bytes=1 << 22)
        spool.register_sinks(["lake"])
        await fill(spool, 3)
        (only,) = segments(spool_dir)
        spool.commit("lake", 4)
        disk_full_while(monkeypatch, only)
        filler = spool_dir / "something-else"
        filler.touch()
        disk_full_while(monkeypatch, filler, "create_segment")
        with pytest.raises(OSError):
            await spool.append(payload(9), 1, received_ns=9)
        assert segments(spool_dir) == [] and spool.bytes_used == 0
        assert "deleted the segment it was writing too" in caplog.text
        filler.unlink()  # room again
        assert (await spool.append(payload(9), 1, received_ns=9)).offset == 4
        spool.close()
        again = opened(spool_dir, max_bytes=1 << 24, segment_bytes=1 << 22)
        assert [r.offset for r in again.read(again.cursor("lake"))] == [4]
        again.close()

    run(scenario())
