"""The newest records kept in memory (aggregator/spool/_recent.py): a reader gets the same
records from them as from the segment files, whatever it asks and however far behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.spool import Spool
from aggregator.spool._segment import HEADER_SIZE, RECORD_OVERHEAD
from tests.aggregator.spool.records import SEGMENT, SESSION, fill, payload, run, segments

# One step of a history: append records of these sizes, or read from a start offset
# (relative to the newest) with a byte budget and a record limit.
APPEND = st.tuples(st.just("append"), st.lists(st.integers(1, 3000), min_size=1, max_size=6))
READ = st.tuples(st.just("read"), st.tuples(st.integers(0, 40), st.integers(1, 20_000),
                                            st.integers(1, 12)))
# A read whose byte budget is exactly what its first k records take on disk.
READ_EXACT = st.tuples(st.just("read_exact"), st.tuples(st.integers(0, 40), st.integers(1, 6)))


def opened(directory: Path, **kwargs: Any) -> Spool:
    spool = Spool(directory, **kwargs)
    spool.open()
    return spool


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(APPEND, READ, READ_EXACT), min_size=1, max_size=30),
       recent_bytes=st.sampled_from([2_000, 9_000, 8 * 2**20]),
       when_full=st.sampled_from(["block", "drop_oldest"]),
       fsync=st.sampled_from(["os", "always"]))
def test_reads_give_what_the_files_give(tmp_path_factory: Any, steps: list[Any],
                                        recent_bytes: int, when_full: Any, fsync: Any) -> None:
    """Two spools take the same appends, one reading the newest records from memory and
    one only from its files: every read gives both the same records, across segment
    rolls, a tail smaller than a read, and the oldest segments dropped when full."""
    async def scenario() -> None:
        options = {"max_bytes": 60_000, "segment_bytes": 12_000, "when_full": when_full,
                   "fsync": fsync}
        tail = opened(tmp_path_factory.mktemp("tail"), recent_bytes=recent_bytes, **options)
        files = opened(tmp_path_factory.mktemp("files"), recent_bytes=0, **options)
        newest = 0
        for kind, what in steps:
            if kind == "append":
                for size in what:
                    for spool in (tail, files):
                        result = await spool.append(payload(newest, size), size % 5 + 1,
                                                    received_ns=newest, session=SESSION,
                                                    seq=newest + 1)
                    newest = result.offset or newest
                continue
            if kind == "read_exact":
                back, records = what
                start = max(1, newest - back)
                first = files.read(start, max_records=records)
                max_bytes = sum(RECORD_OVERHEAD + len(r.payload) for r in first) or 1
                max_records = 100
            else:
                back, max_bytes, max_records = what
                start = max(1, newest - back)
            assert (tail.read(start, max_bytes=max_bytes, max_records=max_records)
                    == files.read(start, max_bytes=max_bytes, max_records=max_records))
        assert tail.read(1, max_records=10_000) == files.read(1, max_records=10_000)
        tail.close()
        files.close()

    run(scenario())


def test_a_reader_that_keeps_up_reads_memory_and_the_files_are_checked_at_the_next_start(
        tmp_path: Path) -> None:
    """Damage to the newest records on disk does not reach a reader that keeps up (it reads
    the bytes that were written); the next start finds it, as it finds any damage."""
    async def write_and_read() -> None:
        spool = opened(tmp_path, max_bytes=1 << 20, segment_bytes=SEGMENT)
        await fill(spool, 12)
        active = segments(tmp_path)[-1]
        with open(active, "r+b") as f:  # a byte of the first record of the active segment
            f.seek(HEADER_SIZE + RECORD_OVERHEAD + 10)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        got = spool.read(9)
        assert [r.offset for r in got] == [9, 10, 11, 12]
        assert [r.payload for r in got] == [payload(i) for i in range(8, 12)]
        assert spool.counters.corrupt_records == 0
        spool.close()

    run(write_and_read())
    again = opened(tmp_path, max_bytes=1 << 20, segment_bytes=SEGMENT)
    try:
        assert again.counters.corrupt_records == 1
        assert [r.offset for r in again.read(9)] == [10, 11, 12]  # 9 was the damaged one
    finally:
        again.close()


def test_a_record_waiting_for_its_fsync_is_not_read(tmp_path: Path) -> None:
    """With fsync "always" a reader sees a record only once it is fsynced, from memory as
    from the files."""
    async def scenario() -> None:
        spool = opened(tmp_path, max_bytes=1 << 20, segment_bytes=SEGMENT, fsync="always")
        await fill(spool, 2)
        pending = asyncio.ensure_future(spool.append(payload(2), 1, received_ns=2))
        await asyncio.sleep(0)  # the append is written and waits for its fsync
        assert [r.offset for r in spool.read(1)] == [1, 2]
        assert (await pending).offset == 3
        assert [r.offset for r in spool.read(1)] == [1, 2, 3]
        spool.close()

    run(scenario())
