"""The part of the spool's disk the spool leaves free, for the sinks' own files.

A spool capped above its disk (or sharing it with other files) would otherwise fill it:
then a local Parquet sink cannot stage the file that delivers the oldest records, its
cursor never moves, the spool frees nothing, and nothing moves until someone frees the
disk by hand. Stopping short of the disk's end leaves that file its room: the sink
delivers, segments are freed, and appends resume by themselves.

A write that would leave less than the reserve fails like a full disk (ENOSPC), so it
meets the full disk's handling everywhere: socket frames wait, HTTP posts get 503,
/readyz, /metrics and `evagg status` say the spool cannot write.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from sinks.disk_room import MIB, sinks_reserve
from sinks.units import size_text

# The disk's free space is read again after this long, or sooner once the spool's own
# writes since the last look could have brought it within SLACK of the reserve.
LOOK_EVERY_S: Final = 0.5
SLACK: Final = 64 * MIB


class DiskReserve:
    def __init__(self, directory: Path,
                 statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._statvfs, self._clock = statvfs, clock
        self.reserve = 0  # set by the first look, from the filesystem's size
        self._free = 0
        self._written = 0  # bytes the spool wrote since the last look
        self._next_look = 0.0

    def check(self, size: int) -> None:
        """Raises OSError(ENOSPC) when writing `size` more bytes would leave the disk
        less free than the reserve."""
        now = self._clock()
        if now < self._next_look and self._free - self._written - size >= self.reserve + SLACK:
            self._written += size
            return
        stats = self._statvfs(self.directory)
        self.reserve = sinks_reserve(stats.f_blocks * stats.f_frsize)
        self._free = stats.f_bavail * stats.f_frsize
        self._written = 0
        self._next_look = now + LOOK_EVERY_S
        if self._free - size < self.reserve:
            raise OSError(errno.ENOSPC, f"the disk has less than {size_text(self.reserve)} "
                          "free, which the spool leaves to the sinks' files")
        self._written = size

    def look_again(self) -> None:
        """Space was freed (segments deleted): the next check reads the disk."""
        self._next_look = 0.0
