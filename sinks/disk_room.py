"""How the agent's writers share the disk of its state directory.

The spool stops short of the disk's end, leaving a reserve for the sinks' own files (a
local Parquet sink stages the file that delivers the oldest records in its lake, an S3
sink in the state directory); an hour merge leaves that reserve free and a spool
segment's worth more, so that neither a merge nor the spool takes the other's room.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Final

MIB: Final = 2**20
RESERVE_MAX: Final = 64 * MIB  # a local Parquet sink's file rolls at 64 MiB by default
RESERVE_SHARE: Final = 10  # on a small disk, a tenth of it, in whole MiB
MERGE_BESIDE_SPOOL: Final = 64 * MIB  # one spool segment, the default


def sinks_reserve(disk_bytes: int) -> int:
    """The bytes the spool leaves free on a filesystem of `disk_bytes`."""
    return min(RESERVE_MAX, max(1, disk_bytes // RESERVE_SHARE // MIB) * MIB)


def merge_margin(directory: Path) -> int:
    """The bytes a merge leaves free on `directory`'s disk."""
    return sinks_reserve(shutil.disk_usage(directory).total) + MERGE_BESIDE_SPOOL
