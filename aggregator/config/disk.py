"""The spool's cap against the filesystem it lives on.

A cap larger than the whole filesystem of the state directory is never reached: the disk
fills first (the spool stops short of its end, for the sinks' files: spool/_disk_reserve.py)
and new events wait until the sinks' deliveries free space (on a disk smaller than a
segment, only once they have passed every record: the spool then deletes the segment it
writes too). `check-config` and the agent's start say so while it
is still a one-line fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from sinks.units import size_text


def spool_disk_warnings(state_dir: Path, max_bytes: int) -> list[str]:
    existing = state_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stats = os.statvfs(existing)
    except OSError:
        return []  # a state_dir the agent cannot reach is state_dir_problems' to name
    size = stats.f_blocks * stats.f_frsize
    if not size or max_bytes <= size:
        return []
    room = max(size * 8 // 10 // 2**20, 1) * 2**20  # four fifths, in whole MiB
    return [f"spool.max_bytes: {size_text(max_bytes)} is more than the whole filesystem of "
            f"agent.state_dir ({state_dir}: {size_text(size)}): the disk fills before the "
            "cap, and then new events wait for the sinks to free it; set spool.max_bytes "
            "to at most "
            f"{size_text(room)}, or move state_dir to a larger disk"]
