"""A busy hour's task fold spills into the merge's own folder, whatever the working directory.

The fold that writes an hour's task fragment (sinks/fragments/build.py) holds about 800
bytes per task attempt under a memory cap, and writes the rest to disk past it (an hour
of about 2.3 million events and up). DuckDB's default place for that is `.tmp` in the
working directory: `/`, read-only, under systemd (ProtectSystem=strict) and in the
DaemonSet (readOnlyRootFilesystem), where every merge of a busy hour failed and was
tried again, for ever. Here the cap is scaled down with the hour (256MB for 400,000
attempts, as 512MB is for the busy hour), and the working directory is one that no
longer exists, so that DuckDB's default cannot be written to even by root.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sinks.fragments.build as fragment_build
from sinks.parquet.compact import run_compact
from sinks.parquet.layout import fragment_key, node_directory, partition_for
from sinks.parquet.writer import open_writer
from tests.proof.disk import tmpfs

ATTEMPTS = 400_000
HOUR_NS = (1_700_000_000 // 3600 - 2) * 3600 * 10**9
PARTITION = f"{partition_for(HOUR_NS)}/{node_directory('test-node')}"


def leave_a_busy_hour(lake: Path, files: int = 4) -> None:
    """A closed hour of ATTEMPTS finished tasks, as the sink writes them."""
    n = ATTEMPTS
    times = pa.array(np.arange(n, dtype=np.int64) + HOUR_NS, pa.timestamp("ns", "UTC"))
    table = pa.table({
        "event_id": pa.array([f"e-{i:08d}" for i in range(n)]), "time": times,
        "kind": pa.array(["task"] * n), "source": pa.array(["python"] * n),
        "name": pa.array([f"fn{i % 50}" for i in range(n)]),
        "state": pa.array(["FINISHED"] * n), "task_id": pa.array([f"t-{i:08d}" for i in range(n)]),
        "attempt": pa.array(np.zeros(n, np.int32)), "job_id": pa.array(["job-1"] * n),
        "node_id": pa.array(["test-node"] * n), "duration_s": pa.array(np.full(n, 0.5)),
        "received": times})
    folder = lake / PARTITION
    folder.mkdir(parents=True)
    step = n // files
    for f in range(files):
        with open_writer(folder / f"part-earlier-{f:04d}.parquet", table.schema) as writer:
            writer.write_table(table.slice(f * step, step))


class SpillWatch:
    """The most bytes DuckDB's spill files held under `root` while the merge ran."""

    def __init__(self, root: Path) -> None:
        self.root, self.most = root, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.01):
            held = 0
            for path in self.root.rglob("*.tmp"):
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    held += path.stat().st_size
            self.most = max(self.most, held)

    def __enter__(self) -> SpillWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


@pytest.fixture
def busy_hour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A lake holding a busy closed hour; the working directory gone; the cap scaled."""
    lake = tmp_path / "lake"
    leave_a_busy_hour(lake)
    monkeypatch.setattr(fragment_build, "MEMORY_LIMIT", "256MB")
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    yield lake


def merge(lake: Path, staging: Path) -> str:
    report = run_compact(str(lake), partition=PARTITION, grace_s=0.0, scratch_dir=staging)
    return str(report)


def test_a_busy_hours_fold_spills_into_the_staging_folder_and_leaves_nothing(
        busy_hour: Path, tmp_path: Path) -> None:
    staging = tmp_path / "state" / "staging" / "lake"
    with SpillWatch(tmp_path) as watch:
        said = merge(busy_hour, staging)
    assert "0 errors" in said and "4 files -> compacted-" in said, said
    assert watch.most > 1 << 20, "the fold did not spill: scale the hour up"
    compacted = next(p.name for p in (busy_hour / PARTITION).iterdir())
    fragment = busy_hour / fragment_key(PARTITION, compacted)
    assert pq.read_metadata(fragment).num_rows == ATTEMPTS
    assert list(staging.iterdir()) == []  # the spill folder went with the fold
    assert not any(p.name == ".tmp" for p in tmp_path.rglob("*")), "DuckDB's default used"


@pytest.fixture
def small_staging_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 72 MiB: past the 64 MiB left for the spool, less than the fold spills."""
    with tmpfs(tmp_path / "disk", "72m") as disk:
        yield disk


def test_a_fold_the_staging_disk_has_no_room_for_waits_as_no_room(
        busy_hour: Path, small_staging_disk: Path) -> None:
    report = run_compact(str(busy_hour), partition=PARTITION, grace_s=0.0,
                         scratch_dir=small_staging_disk / "staging")
    [partition] = report.partitions
    assert partition.error_kind == "no_room", str(report)
    assert f"MiB of disk it may use in {small_staging_disk / 'staging'}: give that disk room" \
        in partition.error, partition.error
    left = sorted(p.name for p in (busy_hour / PARTITION).iterdir())
    assert left == [f"part-earlier-{f:04d}.parquet" for f in range(4)]  # untouched
    assert os.listdir(small_staging_disk / "staging") == []


def test_a_fold_out_of_memory_with_disk_to_spare_is_not_called_no_room(
        busy_hour: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step DuckDB cannot spill, out of memory under a cap too small for it, with the
    whole disk free: counted as the partition's failure, not as the disk's."""
    monkeypatch.setattr(fragment_build, "MEMORY_LIMIT", "32MB")
    report = run_compact(str(busy_hour), partition=PARTITION, grace_s=0.0,
                         scratch_dir=tmp_path / "staging")
    [partition] = report.partitions
    assert partition.error_kind == "partition", str(report)
    assert "OutOfMemoryException" in str(partition.error), partition.error
