"""`evagg compact`: merge each partition's small Parquet files into one, idempotently.

A partition is a leaf directory `date=.../hour=.../node=...`, local or under s3://.
Per partition, in this order:

1. Clean up after an earlier run. A compacted file records in its Parquet key-value
   metadata (`evagg.compacted`) every original file it covers, with its size. A file
   still there under a covered name and size is deleted (a run crashed between writing
   and deleting, or a retrying agent rewrote the same key); so is a compacted file whose
   cover set another compacted file contains (two runs raced).
2. Take the files older than the grace period (a young one may still be rewritten by a
   retrying agent) and, when there are at least `min_files`, merge them: one row per
   event_id, zstd, row groups of 100k, into `compacted-<hash of the input names>.parquet`.
3. Publish the merged file in one step (rename, or PutObject/multipart), then delete the
   inputs that still have the size and time they had when listed.

From 3's publish to its deletes (a moment; until the next run after a crash) a reader
listing the partition sees both copies; the `events` view keeps one row per event_id.

Merged files are written as the sink writes (sinks/parquet/writer.py): timestamps in
microseconds, whatever their inputs hold. With `rewrite_types` a partition is merged
even below `min_files`, a single file too, when one of its files still has the types of
older evagg (nanosecond `time`/`received`): that rewrites a lake for Spark, Trino,
Athena and pyiceberg.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Final

from sinks.fragments.build import NoRoomToFold, Spill, write_fragment
from sinks.locations import is_s3_url
from sinks.parquet.compact_report import CompactReport, PartitionReport
from sinks.parquet.compact_targets import (
    FileEntry,
    LocalTarget,
    NoRoomForMerge,
    S3Target,
    Target,
    spill_room,
)
from sinks.parquet.layout import (
    COMPACTION_META_KEY,
    Cover,
    compacted_name,
    compacted_of_fragment,
    encode_covers,
    fragment_directory,
    fragment_key,
    is_compacted_name,
    is_fragment_name,
    is_lake_file,
    is_partition_directory,
    parse_covers,
)
from sinks.parquet.merge_rows import merge_files
from sinks.parquet.options import S3Options
from sinks.parquet.s3 import S3Store
from sinks.parquet.writer import has_nanosecond_times

GRACE_S: Final = 600.0


def run_compact(target: str, *, partition: str | None = None, min_files: int = 2,
                endpoint_url: str | None = None, dry_run: bool = False,
                grace_s: float = GRACE_S, region: str | None = None,
                path_style: bool | None = None, now: float | None = None,
                upload_args: dict[str, str] | None = None,
                rewrite_types: bool = False, scratch_dir: Path | None = None) -> CompactReport:
    """Compact every partition under `target` (or under `partition` within it).

    Raises ValueError for bad arguments and StoreError/OSError when the target cannot be
    listed; a partition that fails is reported in `CompactReport.errors`. `upload_args`:
    what S3 uploads ask for, as the sink's (`sinks.parquet.s3_uploads.upload_args`).
    `rewrite_types`: also merge a partition of fewer files (one, too) when a file in it
    has nanosecond timestamps (`has_nanosecond_times`). `scratch_dir`: where an S3
    partition's inputs are downloaded and its merged file is written before upload, and
    where any partition's task fragment spills what its fold cannot hold in memory (the
    system's temporary directory unless given; the agent gives its state directory).
    """
    if min_files < 2:
        raise ValueError("min_files must be at least 2")
    prefix = _partition_prefix(partition)
    store: Target
    if is_s3_url(target):
        s3 = S3Options(endpoint_url=endpoint_url, region=region,
                       path_style=bool(endpoint_url) if path_style is None else path_style,
                       upload_args=upload_args or {})
        scratch = scratch_dir or Path(tempfile.gettempdir())
        store = S3Target(S3Store(target, s3, staging_dir=scratch))
    else:
        store = LocalTarget(Path(target).expanduser(), staging_dir=scratch_dir)
    report = CompactReport(store.describe(), dry_run)
    leaves: dict[str, list[FileEntry]] = {}
    for entry in store.files(prefix):
        directory, _, name = entry.key.rpartition("/")
        if is_partition_directory(directory) and is_lake_file(name):
            leaves.setdefault(directory, []).append(entry)
    deadline = (time.time() if now is None else now) - grace_s
    for directory, entries in sorted(leaves.items()):
        result = PartitionReport(directory, dry_run=dry_run)
        try:
            _compact_partition(store, entries, result, min_files, deadline, dry_run,
                               rewrite_types)
        except Exception as exc:  # one bad partition must not stop the others
            result.error = f"{type(exc).__name__}: {exc}"
            result.error_kind = ("no_room" if isinstance(exc, NoRoomForMerge | NoRoomToFold)
                                 else "partition")
        report.partitions.append(result)
    return report


def _partition_prefix(partition: str | None) -> str:
    parts = [p for p in (partition or "").split("/") if p]
    if any(p in (".", "..") or "=" not in p for p in parts):
        raise ValueError(f"partition {partition!r}: expected e.g. date=2026-01-02/hour=03")
    return "".join(f"{p}/" for p in parts)


def _compact_partition(store: Target, entries: list[FileEntry], result: PartitionReport,
                       min_files: int, deadline: float, dry_run: bool,
                       rewrite_types: bool = False) -> None:
    covers = {e.name: _covers(store, e) for e in entries if is_compacted_name(e.name)}
    leftovers = _covered_leftovers(entries, covers)
    live = [e for e in entries if e not in leftovers]
    eligible = sorted((e for e in live if e.modified <= deadline),
                      key=lambda e: (not is_compacted_name(e.name), e.name))
    result.young = len(live) - len(eligible)
    result.too_few = len([e for e in eligible if not is_compacted_name(e.name)]) > 0 and \
        len(eligible) < min_files
    if len(eligible) >= min_files or (rewrite_types and _old_types(store, eligible)):
        result.inputs = [e.name for e in eligible]
        result.output = _output_name(eligible)
        if not dry_run:
            result.rows = _merge_and_publish(store, eligible, covers, result.output)
    doomed = leftovers + (eligible if result.output else [])
    if doomed and not dry_run:
        listed = {(e.key, e.size, e.modified) for e in store.files(_directory(doomed[0]) + "/")}
        doomed = [e for e in doomed if (e.key, e.size, e.modified) in listed]  # not rewritten
        store.delete([e.key for e in doomed])
    result.deleted = [e.name for e in doomed]
    if not dry_run:
        kept = [e for e in live if is_compacted_name(e.name) and e not in doomed]
        result.fragments = _mend_fragments(store, result.partition, kept, result.output)


def _mend_fragments(store: Target, directory: str, kept: list[FileEntry],
                    merged: str | None) -> int:
    """After a partition's merge, one task fragment per compacted file in it: build the
    ones a compacted file lacks (written before fragments existed, or its fragment lost),
    delete those whose compacted file is gone. Returns the fragments built."""
    wanted = {e.name for e in kept} | ({merged} if merged else set())
    found = {e.name: e for e in store.files(fragment_directory(directory) + "/")
             if is_fragment_name(e.name)}
    have = {compacted_of_fragment(name) for name in found}
    built = 0
    with store.scratch("fragment-") as scratch:
        for entry in kept:
            if entry.name not in have:
                store.make_room_for(entry.size)  # a download, and a fragment of less
                _publish_fragment(store, store.local_copy(entry.key, Path(scratch)),
                                  directory, entry.name, Path(scratch))
                built += 1
    stale = [e.key for name, e in found.items() if compacted_of_fragment(name) not in wanted]
    if stale:
        store.delete(stale)
    return built


def _publish_fragment(store: Target, events_file: Path, directory: str, compacted: str,
                      scratch: Path) -> None:
    """Write the task fragment of a merged file and publish it, before the merged file
    itself is published: a reader pairs a fragment with its compacted file by name and
    ignores one whose file is not there yet; a run cut short rewrites the same key."""
    key = fragment_key(directory, compacted)
    staged = store.scratch_path(key, scratch)
    staged.parent.mkdir(parents=True, exist_ok=True)
    try:
        with store.spill_folder() as folder:
            # less the fragment itself, which may be written to the same disk meanwhile
            # (it is smaller than its events file)
            room = spill_room(Path(folder)) - events_file.stat().st_size
            write_fragment(events_file, staged, compacted, Spill(Path(folder), room))
        store.publish(staged, key)
    finally:
        staged.unlink(missing_ok=True)


def _covers(store: Target, entry: FileEntry) -> set[Cover]:
    """What a compacted file says it covers (nothing, if the metadata is not ours)."""
    return parse_covers(store.kv_metadata(entry.key).get(COMPACTION_META_KEY.encode()))


def _old_types(store: Target, entries: list[FileEntry]) -> bool:
    """Whether any of these files has timestamps of the old unit (nanoseconds)."""
    return any(has_nanosecond_times(store.arrow_schema(e.key)) for e in entries)


def _covered_leftovers(entries: list[FileEntry],
                       covers: dict[str, set[Cover]]) -> list[FileEntry]:
    covered: set[Cover] = set().union(*covers.values())
    leftovers = []
    for entry in entries:
        mine = covers.get(entry.name)
        if mine is None:
            if (entry.name, entry.size) in covered:
                leftovers.append(entry)
        elif any(other != entry.name and mine <= theirs and (mine != theirs or other < entry.name)
                 for other, theirs in covers.items()):
            leftovers.append(entry)  # another compacted file holds all of its rows
    return leftovers


def _output_name(inputs: list[FileEntry]) -> str:
    return compacted_name(e.name for e in inputs)


def _directory(entry: FileEntry) -> str:
    return entry.key.rpartition("/")[0]


def _merge_and_publish(store: Target, inputs: list[FileEntry], covers: dict[str, set[Cover]],
                       output: str) -> int:
    covered: set[Cover] = set()
    for entry in inputs:
        covered |= covers.get(entry.name) or {(entry.name, entry.size)}
    metadata = encode_covers([e.name for e in inputs], covered)
    key = f"{_directory(inputs[0])}/{output}"
    store.make_room_for(sum(e.size for e in inputs))
    with store.scratch("compact-") as scratch:
        files = [store.local_copy(e.key, Path(scratch)) for e in inputs]
        merged = store.scratch_path(key, Path(scratch))
        try:
            rows = merge_files(files, merged, metadata)
            _publish_fragment(store, merged, _directory(inputs[0]), output, Path(scratch))
            store.publish(merged, key)
        finally:
            merged.unlink(missing_ok=True)
    return rows
