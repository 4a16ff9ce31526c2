"""The spool's reserve on its disk, with the disk's figures and the clock in the test's
hands: when the disk is read, and when an append fails as a full disk does."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from aggregator.spool._disk_reserve import LOOK_EVERY_S, SLACK, DiskReserve

MIB = 2**20
DISK = 10 * 2**30  # the reserve: 64 MiB


class Disk:
    def __init__(self, free: int) -> None:
        self.free = free
        self.reads = 0

    def statvfs(self, _path: Path) -> os.statvfs_result:
        self.reads += 1
        # f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail,
        # f_flag, f_namemax
        return os.statvfs_result((4096, 1, DISK, self.free, self.free, 0, 0, 0, 0, 255))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reserve_on(disk: Disk, clock: Clock) -> DiskReserve:
    return DiskReserve(Path("/spool"), statvfs=disk.statvfs, clock=clock)


def test_far_from_the_reserve_the_disk_is_read_twice_a_second_at_most() -> None:
    disk, clock = Disk(free=10 * SLACK), Clock()
    reserve = reserve_on(disk, clock)
    for _ in range(100):
        reserve.check(MIB)
    assert disk.reads == 1
    clock.now += LOOK_EVERY_S
    reserve.check(MIB)
    assert disk.reads == 2


def test_the_spool_s_own_writes_bring_the_next_read_forward() -> None:
    """Between two reads the spool counts what it wrote: once that could have brought the
    disk within SLACK of the reserve, it reads the disk again at once."""
    disk, clock = Disk(free=64 * MIB + SLACK + 10 * MIB), Clock()
    reserve = reserve_on(disk, clock)
    reserve.check(MIB)  # read: 10 MiB above reserve + SLACK, 1 MiB of it now written
    for _ in range(9):
        reserve.check(MIB)  # 10 MiB written in all: the disk may be at reserve + SLACK
    assert disk.reads == 1
    reserve.check(MIB)  # one more would pass it: read again
    assert disk.reads == 2


def test_an_append_into_the_reserve_fails_as_a_full_disk_and_a_freed_segment_reads_again(
        ) -> None:
    disk, clock = Disk(free=64 * MIB + 3 * MIB), Clock()
    reserve = reserve_on(disk, clock)
    reserve.check(2 * MIB)
    with pytest.raises(OSError) as raised:
        reserve.check(4 * MIB)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value.strerror) == ("the disk has less than 64MiB free, which the "
                                          "spool leaves to the sinks' files")
    disk.free += 32 * MIB  # a segment deleted, its space back
    reserve.look_again()
    reserve.check(4 * MIB)
    assert disk.reads == 3
