"""How much of its disk the spool leaves to the sinks' files."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from aggregator.spool._disk_reserve import DiskReserve, reserve_for

MIB = 2**20


@pytest.mark.parametrize(("disk", "reserve"), [
    (16 * MIB, MIB), (24 * MIB, 2 * MIB), (5 * MIB, MIB), (100 * 2**30, 64 * MIB),
    (640 * MIB, 64 * MIB), (320 * MIB, 32 * MIB),
])
def test_the_reserve_is_a_tenth_of_a_small_disk_and_64_mib_of_a_large_one(
        disk: int, reserve: int) -> None:
    assert reserve_for(disk) == reserve


def test_a_write_into_the_reserve_fails_as_a_full_disk_does(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path)
    reserve.check(1)
    free = reserve._free
    with pytest.raises(OSError) as raised:
        reserve.check(free - reserve.reserve + 1)
    assert raised.value.errno == errno.ENOSPC
    assert "which the spool leaves to the sinks' files" in str(raised.value)
    reserve.check(max(1, free - reserve.reserve - 16 * MIB))  # fits: read the disk again
