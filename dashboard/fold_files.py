"""Which Parquet files the task fold still has to read (dashboard/fold.py).

`evagg compact` (sinks/parquet/compact.py) names its files `compacted-...` and records in each
the (name, size) of the files it replaced; a compacted file whose inputs were all folded
need not be read, and a folded file that vanished is explained when a compacted file in
its folder covers it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from dashboard.listing import FileEntry

Cover = tuple[str, int]  # (file name, size)
COMPACTED_PREFIX = "compacted-"  # as sinks/parquet/compact.py names its files
META_KEY = "evagg.compacted"  # the Parquet metadata key it records the covered files in
BATCH_BYTES = 2**30  # fold at most this much Parquet per transaction (bounds memory)
BATCH_FILES = 10_000


def parent_and_name(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


def held_by_folder(known: dict[str, set[Cover]], listed: dict[str, FileEntry]
                    ) -> dict[str, set[Cover]]:
    """Per folder: what its listed compacted files say they cover."""
    held: dict[str, set[Cover]] = {}
    for path in listed:
        if path in known:
            held.setdefault(parent_and_name(path)[0], set()).update(known[path])
    return held


def explained(path: str, size: int, known: dict[str, set[Cover]],
               held: dict[str, set[Cover]]) -> bool:
    """Whether a listed compacted file in the same folder holds a vanished file's rows:
    it covers the file itself, or (for a compacted file) everything that file covered."""
    parent, name = parent_and_name(path)
    there = held.get(parent, set())
    return (name, size) in there or (bool(known.get(path)) and known[path] <= there)


def coverage(folded: dict[str, int], known: dict[str, set[Cover]]) -> dict[str, set[Cover]]:
    """Per folder: the (name, size) of every file whose rows are folded."""
    covered: dict[str, set[Cover]] = {}
    for path, size in folded.items():
        parent, name = parent_and_name(path)
        covered.setdefault(parent, set()).add((name, size))
        covered[parent] |= known.get(path, set())
    return covered


def is_compacted(entry: FileEntry) -> bool:
    return parent_and_name(entry.path)[1].startswith(COMPACTED_PREFIX)


def batches(files: list[FileEntry]) -> Iterator[list[FileEntry]]:
    batch: list[FileEntry] = []
    size = 0
    for entry in files:
        if batch and (size + entry.size > BATCH_BYTES or len(batch) >= BATCH_FILES):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry.size
    if batch:
        yield batch


def parse_covers(raw: bytes | str | None) -> set[Cover]:
    """What `evagg compact`'s metadata says a compacted file covers (empty if not ours)."""
    try:
        recorded = json.loads(raw) if raw else {}
        return {(str(name), int(size)) for name, size in recorded.get("covers", [])}
    except (ValueError, TypeError, AttributeError):
        return set()
