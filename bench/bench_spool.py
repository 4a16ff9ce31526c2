"""Spool throughput: appends with fsync "os" and "always" side by side, then reads and recovery.

Records are ~100 KB (about 800 events of 125 bytes as Arrow), the size the agent writes.
Each append scenario runs for a fixed time; a sink commits as it goes, so the disk use
stays bounded. "loop CPU" is the event-loop thread's CPU time per append (commits and
segment deletions included): what an append costs the agent, apart from the time it waits
for the fsync thread. A 100 KB append is about 5 us of Python, 25-35 us of CRC32 and
35 us of write syscall. "keep up" is a sink reading each record as it is appended, from
the newest records kept in memory and from the segment files, side by side.

    .venv/bin/python bench/bench_spool.py [--seconds 2] [--record-kb 100] [--dir PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from aggregator.spool import Spool

EVENTS_PER_RECORD = 800


async def _appender(spool: Spool, payload: bytes, deadline: float, done: list[int]) -> None:
    while time.perf_counter() < deadline:
        await spool.append(payload, EVENTS_PER_RECORD, received_ns=time.time_ns())
        done[0] += 1
        if done[0] % 256 == 0:  # a sink keeps up, so the spool stays small
            spool.commit("bench", spool.next_offset - 128)


async def bench_append(directory: Path, fsync: str, writers: int, payload: bytes,
                       seconds: float) -> None:
    spool = Spool(directory, max_bytes=2 * 2**30, fsync=fsync)  # type: ignore[arg-type]
    spool.open()
    spool.register_sinks(["bench"])
    done = [0]
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    deadline = wall0 + seconds
    await asyncio.gather(*(_appender(spool, payload, deadline, done) for _ in range(writers)))
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    n = done[0]
    spool.close()  # waits for the sealing fsyncs still running, so they are counted
    await asyncio.sleep(0.01)
    print(f"append fsync={fsync:<6} writers={writers:<3} {n / wall:>9,.0f} records/s "
          f"{n * len(payload) / wall / 2**20:>8,.0f} MiB/s "
          f"{n * EVENTS_PER_RECORD / wall / 1e6:>6.2f} M events/s  "
          f"loop CPU {cpu / n * 1e6:>6.1f} us/append  fsyncs {spool.counters.fsyncs:>6,} "
          f"({n / max(1, spool.counters.fsyncs):.1f} appends per fsync)")


async def bench_read_and_recover(directory: Path, payload: bytes, records: int) -> None:
    spool = Spool(directory, max_bytes=2 * 2**30)
    spool.open()
    for _ in range(records):
        await spool.append(payload, EVENTS_PER_RECORD, received_ns=0)
    start = spool.first_offset
    spool.close()
    size = sum(p.stat().st_size for p in directory.glob("*.seg"))
    t0 = time.perf_counter()
    spool = Spool(directory, max_bytes=2 * 2**30)
    report = spool.open()
    opened = time.perf_counter() - t0
    print(f"open     {report.records:,} records, {size / 2**20:,.0f} MiB in "
          f"{report.segments} segments: {opened * 1e3:,.0f} ms "
          f"({size / opened / 2**30:.2f} GiB/s, every record's CRC checked)")
    t0, got, position = time.perf_counter(), 0, start
    while batch := spool.read(position, max_bytes=16 * 2**20):
        got += len(batch)
        position = batch[-1].offset + 1
    took = time.perf_counter() - t0
    print(f"read     {got / took:,.0f} records/s {got * len(payload) / took / 2**20:,.0f} MiB/s "
          f"(16 MiB reads, CRC checked)")
    spool.close()


async def bench_keeping_up(directory: Path, payload: bytes, records: int,
                           from_memory: bool) -> None:
    """A sink that keeps up: each append is read back at once, as the delivery loop reads
    it; the loop's CPU for the reads alone, from the newest records the spool keeps in
    memory (its default) or from the segment files (none kept)."""
    spool = (Spool(directory, max_bytes=2 * 2**30) if from_memory
             else Spool(directory, max_bytes=2 * 2**30, recent_bytes=0))
    spool.open()
    spool.register_sinks(["bench"])
    reading = 0.0
    for i in range(records):
        offset = (await spool.append(payload, EVENTS_PER_RECORD, received_ns=0)).offset
        assert offset is not None
        cpu = time.thread_time()
        got = spool.read(offset)
        reading += time.thread_time() - cpu
        assert got and got[0].offset == offset
        if i % 256 == 0:
            spool.commit("bench", offset)
    spool.close()
    where = "memory" if from_memory else "files"
    print(f"keep up  reads from {where:<6} {reading / records * 1e6:>6.1f} us of loop CPU per "
          f"record read ({reading / records / EVENTS_PER_RECORD * 1e9:,.0f} ns per event)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per append scenario")
    parser.add_argument("--record-kb", type=int, default=100)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    args = parser.parse_args()
    payload = os.urandom(args.record_kb * 1000)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)
        print(f"records of {len(payload):,} bytes ({EVENTS_PER_RECORD} events), "
              f"{args.seconds:g} s per scenario, in {base}")
        for fsync in ("os", "always"):
            for writers in (1, 16):
                await bench_append(base / f"{fsync}-{writers}", fsync, writers, payload,
                                   args.seconds)
        await bench_read_and_recover(base / "recover", payload, 5000)
        for round_ in range(2):  # alternating, side by side
            for from_memory in (False, True):
                await bench_keeping_up(base / f"keep-{round_}-{from_memory}", payload, 3000,
                                       from_memory)


if __name__ == "__main__":
    asyncio.run(main())
