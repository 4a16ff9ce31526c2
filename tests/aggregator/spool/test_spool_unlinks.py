"""Collected segments are unlinked in a background thread, never on the event loop, and
their space counts as free only once the unlink has happened: a full spool waits for it,
a full disk's commit waits for it, a failing unlink is counted and retried, and an unlink
left pending by a kill or a stuck close is done at the next start."""

from __future__ import annotations

import asyncio
import errno
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aggregator.spool._cursors as cursors_module
import aggregator.spool._reaper as reaper_module
from aggregator.spool import Spool
from aggregator.spool._reaper import THREAD_NAME
from aggregator.spool._segment import HEADER_SIZE
from aggregator.spool._state import write_cursor as real_write
from tests.aggregator.spool.records import (
    FRAME,
    SEGMENT,
    fill,
    on_disk,
    payload,
    run,
    segments,
)


@pytest.fixture
def spool_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "spool"


class WatchedSpool(Spool):
    """Records which thread unlinks each segment; `gate` holds unlinks until set, and
    `failures` makes the first ones fail with that exception."""

    def __init__(self, directory: Path, **kwargs: Any) -> None:
        kwargs.setdefault("max_bytes", 1 << 20)
        kwargs.setdefault("segment_bytes", SEGMENT)
        super().__init__(directory, **kwargs)
        self.unlinked_in: list[tuple[str, str]] = []  # (thread name, file name)
        self.gate = threading.Event()
        self.gate.set()
        self.failures: list[Exception] = []

    def _unlink_segment(self, path: Path) -> None:
        self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        self.unlinked_in.append((threading.current_thread().name, path.name))
        super()._unlink_segment(path)


def watched(directory: Path, **kwargs: Any) -> WatchedSpool:
    spool = WatchedSpool(directory, **kwargs)
    spool.open()
    return spool


def test_collected_segments_are_unlinked_in_the_background_thread(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = watched(spool_dir)
        spool.register_sinks(["lake"])
        await fill(spool, 12)
        spool.gate.clear()
        spool.commit("lake", 9)  # segments 1-4 and 5-8 are collected
        assert spool.first_offset == 9 and spool.lag("lake") == (4, sum(
            i % 7 + 1 for i in range(8, 12)))
        for _ in range(5):  # the loop runs on while the unlinks wait
            await asyncio.sleep(0.01)
        assert len(segments(spool_dir)) == 3 and spool.bytes_used == on_disk(spool_dir)
        assert spool.counters.segments_deleted == 0
        spool.gate.set()
        assert await spool.collected(timeout=10)
        assert len(segments(spool_dir)) == 1 and spool.bytes_used == on_disk(spool_dir)
        assert spool.counters.segments_deleted == 2
        assert [name for name, _ in spool.unlinked_in] == [THREAD_NAME, THREAD_NAME]
        assert threading.current_thread().name != THREAD_NAME
        assert [r.offset for r in spool.read(spool.cursor("lake"))] == [9, 10, 11, 12]
        spool.close()

    run(scenario())


def test_outside_an_event_loop_the_unlink_runs_in_the_caller(spool_dir: Path) -> None:
    spool = watched(spool_dir)
    spool.register_sinks(["lake"])
    run(fill(spool, 12))
    spool.commit("lake", 9)
    assert len(segments(spool_dir)) == 1 and spool.bytes_used == on_disk(spool_dir)
    assert [name for name, _ in spool.unlinked_in] == [threading.current_thread().name] * 2
    spool.close()


def test_a_full_spool_admits_only_once_the_background_unlink_freed_the_space(
        spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = watched(spool_dir, max_bytes=4 * SEGMENT, when_full="block")
        spool.register_sinks(["lake"])
        await fill(spool, 16)
        assert spool.bytes_used + FRAME + HEADER_SIZE > spool.max_bytes
        spool.gate.clear()
        waiting = asyncio.create_task(spool.append(payload(100), 5, received_ns=0))
        await asyncio.sleep(0.01)
        spool.commit("lake", 5)  # the first segment is collected, its unlink held
        for _ in range(10):
            await asyncio.sleep(0.01)
        assert not waiting.done(), "admitted before the space was free"
        assert spool.bytes_used == on_disk(spool_dir) <= spool.max_bytes
        spool.gate.set()
        result = await asyncio.wait_for(waiting, timeout=10)
        assert result.offset == 17 and spool.counters.full_waits == 1
        assert spool.bytes_used == on_disk(spool_dir) <= spool.max_bytes
        assert [name for name, _ in spool.unlinked_in] == [THREAD_NAME]
        spool.close()

    run(scenario())


def test_drop_oldest_waits_for_unlinks_under_way_instead_of_dropping(spool_dir: Path) -> None:
    async def scenario() -> None:
        spool = watched(spool_dir, max_bytes=4 * SEGMENT, when_full="drop_oldest")
        spool.register_sinks(["lake"])
        await fill(spool, 16)
        spool.gate.clear()
        spool.commit("lake", 5)  # the first segment is collected, its unlink held
        threading.Timer(0.2, spool.gate.set).start()
        await fill(spool, 1, start=16)
        assert spool.losses.totals() == {} and spool.counters.dropped_records == 0
        assert spool.first_offset == 5 and spool.bytes_used == on_disk(spool_dir)
        spool.close()

    run(scenario())


def test_a_commit_on_a_full_disk_waits_for_the_unlinks_under_way(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cursor file needs the space that a collected segment's unlink frees: the commit
    that meets ENOSPC waits for the unlinks under way, then writes the cursor."""

    async def scenario() -> None:
        spool = watched(spool_dir)
        spool.register_sinks(["lake"])
        await fill(spool, 12)
        spool.gate.clear()
        spool.commit("lake", 5)  # segment 1 collected, its unlink held
        first = segments(spool_dir)[0]
        calls: list[int] = []

        def full_while_first_is_there(directory: Path, sink: str, next_offset: int) -> None:
            calls.append(next_offset)
            if first.exists():
                raise OSError(errno.ENOSPC, "No space left on device")
            real_write(directory, sink, next_offset)

        monkeypatch.setattr(cursors_module, "write_cursor", full_while_first_is_there)
        threading.Timer(0.2, spool.gate.set).start()
        spool.commit("lake", 6)
        assert calls == [6, 6] and not first.exists()
        assert spool.counters.enospc_commits == 1
        assert spool.bytes_used == on_disk(spool_dir)
        spool.close()
        monkeypatch.undo()
        again = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=SEGMENT)
        again.open()
        assert again.cursor("lake") == 6
        again.close()

    run(scenario())


def test_a_failing_unlink_is_counted_logged_once_and_retried(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(reaper_module, "RETRY_FIRST_S", 0.05)

    async def scenario() -> None:
        spool = watched(spool_dir)
        spool.register_sinks(["lake"])
        await fill(spool, 12)
        spool.failures = [OSError(errno.EACCES, "Permission denied"),
                          OSError(errno.EACCES, "Permission denied"), RuntimeError("bug")]
        spool.commit("lake", 5)  # no exception reaches the committer
        deadline = time.monotonic() + 10
        while len(segments(spool_dir)) > 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert await spool.collected(timeout=10)
        assert len(segments(spool_dir)) == 2 and spool.bytes_used == on_disk(spool_dir)
        assert spool.counters.unlink_errors == {"EACCES": 2, "RuntimeError": 1}
        assert ("unlink_errors", 3) in spool.counters.items()
        assert ("unlink_errors_EACCES", 2) in spool.counters.items()
        assert spool.counters.segments_deleted == 1
        spool.commit("lake", 9)  # the worker is alive and well
        assert await spool.collected(timeout=10)
        assert len(segments(spool_dir)) == 1 and spool.counters.segments_deleted == 2
        spool.close()

    with caplog.at_level("WARNING", logger="evagg.spool"):
        run(scenario())
    warnings = [r.getMessage() for r in caplog.records if "unlinking" in r.getMessage()]
    assert len(warnings) == 2  # once per reason


def test_a_stuck_unlink_does_not_hang_close_and_the_next_start_collects_it(
        spool_dir: Path) -> None:
    spool = watched(spool_dir)
    spool.register_sinks(["lake"])

    async def deliver() -> None:
        await fill(spool, 12)
        spool.gate.clear()  # the unlink never returns while the spool closes
        spool.commit("lake", 9)
        started = time.monotonic()
        spool.close()
        # milliseconds here; a close waiting on the stuck unlink would never return, so a
        # bound no loaded machine reaches still tells the two apart
        assert time.monotonic() - started < 20

    try:
        run(deliver())
        assert len(segments(spool_dir)) == 3
        again = watched(spool_dir)
        assert again.first_offset == 1  # before register_sinks, every known cursor pins

        async def restart() -> None:
            again.register_sinks(["lake"])
            assert await again.collected(timeout=10)

        run(restart())
        assert len(segments(spool_dir)) == 1 and again.bytes_used == on_disk(spool_dir)
        assert [r.offset for r in again.read(again.cursor("lake"))] == [9, 10, 11, 12]
        again.close()
    finally:
        spool.gate.set()


_KILLED_CHILD = """
import asyncio, sys, threading
from pathlib import Path
from aggregator.spool import Spool

class Stuck(Spool):
    def _unlink_segment(self, path):
        threading.Event().wait()  # the unlink is pending when the kill comes

async def main():
    spool = Stuck(Path(sys.argv[1]), max_bytes=1 << 20, segment_bytes=int(sys.argv[2]))
    spool.open()
    spool.register_sinks(["lake"])
    for i in range(12):
        await spool.append(bytes([i]) * 500, 1, received_ns=i)
    spool.commit("lake", 9)
    print("committed", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_unlinks_pending_at_a_kill_are_collected_at_the_next_start(spool_dir: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(spool_dir), str(SEGMENT)],
                             cwd=root, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "committed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert len(segments(spool_dir)) == 3  # the two collected ones were never unlinked
    spool = watched(spool_dir)

    async def restart() -> None:
        spool.register_sinks(["lake"])
        assert await spool.collected(timeout=10)

    run(restart())
    assert len(segments(spool_dir)) == 1 and spool.bytes_used == on_disk(spool_dir)
    assert [name for name, _ in spool.unlinked_in] == [THREAD_NAME] * 2
    assert [r.offset for r in spool.read(spool.cursor("lake"))] == [9, 10, 11, 12]
    assert run(spool.append(b"x", 1, received_ns=0)).offset == 13
    spool.close()
