"""Which Parquet files the task fold still has to read (dashboard/lake/fold.py).

`evagg compact` (sinks/parquet/compact.py) names its files `compacted-...` and records in each
the (name, size) of the files it replaced; a compacted file whose inputs were all folded
need not be read, and a folded file that vanished is explained when a compacted file in
its folder covers it. A compacted file none of whose rows were folded is folded from its
task fragment where one is listed (`by_fragment`).
"""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.lake.listing import FileEntry, Listing
from sinks.parquet.layout import Cover, fragment_key, is_compacted_name, parse_covers

__all__ = ["Cover", "batches", "by_fragment", "coverage", "explained", "held_by_folder",
           "is_compacted", "parse_covers"]
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
    return is_compacted_name(parent_and_name(entry.path)[1])


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


def by_fragment(todo: list[FileEntry], listing: Listing, known: dict[str, set[Cover]],
                 covered: dict[str, set[Cover]]) -> dict[str, FileEntry]:
    """The compacted files to fold from their task fragments, with their fragment: those
    whose fragment is listed and none of whose rows the fold has (a fragment is all of
    an hour's tasks: it cannot be folded in part)."""
    fragments = {f.relative: f for f in listing.fragments}
    chosen: dict[str, FileEntry] = {}
    for entry in todo:
        if not is_compacted(entry):
            continue
        directory, _, name = entry.relative.rpartition("/")
        fragment = fragments.get(fragment_key(directory, name))
        folded = known.get(entry.path, set()) & covered.get(parent_and_name(entry.path)[0], set())
        if fragment is not None and not folded:
            chosen[entry.path] = fragment
    return chosen
