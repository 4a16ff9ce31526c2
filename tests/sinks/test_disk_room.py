"""How the agent's writers share the state directory's disk: the spool's reserve for the
sinks' files, and the merge's margin beside both."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.disk_room import MERGE_BESIDE_SPOOL, merge_margin, sinks_reserve

MIB = 2**20


@pytest.mark.parametrize(("disk", "reserve"), [
    (16 * MIB, MIB), (24 * MIB, 2 * MIB), (5 * MIB, MIB), (100 * 2**30, 64 * MIB),
    (640 * MIB, 64 * MIB), (320 * MIB, 32 * MIB),
])
def test_the_reserve_is_a_tenth_of_a_small_disk_and_64_mib_of_a_large_one(
        disk: int, reserve: int) -> None:
    assert sinks_reserve(disk) == reserve


def test_a_merge_leaves_the_spool_s_reserve_and_a_segment_more(tmp_path: Path) -> None:
    import shutil

    total = shutil.disk_usage(tmp_path).total
    assert merge_margin(tmp_path) == sinks_reserve(total) + MERGE_BESIDE_SPOOL
