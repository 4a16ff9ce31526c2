"""`evagg compact` on a local directory and on S3 (a real moto server), read with DuckDB."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aggregator.decode.normalize import Stamp, rows_to_batch
from sinks.parquet.compact import run_compact
from sinks.parquet.compact_targets import LocalTarget, S3Target
from sinks.parquet.layout import COMPACTION_META_KEY
from sinks.parquet.merge_rows import merge_files
from sinks.parquet.writer import open_writer, written_schema
from sinks.schema import EVENT_SCHEMA
from tests.agentproc import REPO
from tests.sinks.moto_server import MotoS3, aws_env

HOUR = "date=2026-01-02/hour=03/node=n1"
OTHER_HOUR = "date=2026-01-02/hour=04/node=n1"
OLD = time.time() - 3600


def events(ids: range, prefix: str = "e") -> pa.Table:
    rows = [{"event_id": f"{prefix}{i:08d}", "kind": "task", "task_id": f"t{i}",
             "received": 1_767_322_800_000_000_000 + i} for i in ids]
    return pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)


def part(first: int) -> str:
    return f"part-spoolA-{first:020d}.parquet"


class Lake:
    """One place to put files and read them back: a local directory or an S3 prefix."""

    def __init__(self, kind: str, root: Path, moto: MotoS3 | None = None) -> None:
        self.kind = kind
        self.root = root
        self.moto = moto
        self.bucket = moto.create_bucket() if moto else ""
        self.url = f"s3://{self.bucket}/lake/" if moto else str(root)

    def put(self, key: str, table: pa.Table, *, age_s: float = 3600) -> None:
        if self.moto is None:
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, path)
            os.utime(path, (time.time() - age_s, time.time() - age_s))
            return
        body = io.BytesIO()
        pq.write_table(table, body)
        self.moto.client().put_object(Bucket=self.bucket, Key=f"lake/{key}",
                                      Body=body.getvalue())

    def names(self, partition: str = HOUR) -> list[str]:
        if self.moto is None:
            directory = self.root / partition
            return sorted(os.listdir(directory)) if directory.is_dir() else []
        keys = self.moto.keys(self.bucket, f"lake/{partition}/")
        return [key.rpartition("/")[2] for key in keys]

    def settle(self) -> None:
        """Age every local file past the grace period (compacted ones are new)."""
        if self.moto is None:
            for path in self.root.rglob("*.parquet"):
                os.utime(path, (OLD, OLD))

    def counts(self) -> tuple[int, int]:
        """(rows, distinct event ids) over every Parquet file, as a reader sees them."""
        con = self.moto.duckdb() if self.moto else duckdb.connect()
        (rows, distinct), = con.execute(
            f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet("
            f"'{self.url.rstrip('/')}/**/*.parquet', hive_partitioning = true)").fetchall()
        return rows, distinct

    def compact(self, *, settled: bool = True, **options: Any) -> Any:
        """Run compaction; `settled`: every S3 object counts as older than the grace
        period (S3 ages come from the server's clock and cannot be backdated)."""
        if self.moto is not None:
            options.setdefault("endpoint_url", self.moto.endpoint_url)
            if settled:
                options.update(grace_s=0, now=time.time() + 2)
        return run_compact(self.url, **options)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lake:
    if request.param == "local":
        return Lake("local", tmp_path / "lake")
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)
    return Lake("s3", tmp_path, request.getfixturevalue("moto"))


def fill(lake: Lake, files: int = 12, per_file: int = 50, partition: str = HOUR) -> None:
    for n in range(files):
        lake.put(f"{partition}/{part(1 + n * per_file)}",
                 events(range(n * per_file, (n + 1) * per_file), prefix=f"{partition}-"))


def test_small_files_become_one_and_a_second_run_is_a_no_op(lake: Lake) -> None:
    fill(lake)
    report = lake.compact()
    assert not report.errors and report.merged_files == 12 and report.written_files == 1
    names = lake.names()
    assert len(names) == 1 and names[0].startswith("compacted-")
    assert lake.counts() == (600, 600)
    assert report.partitions[0].rows == 600

    again = lake.compact()
    assert (again.written_files, again.deleted_files, again.errors) == (0, 0, [])
    assert lake.names() == names


def test_merged_file_records_its_inputs_zstd_and_big_row_groups(tmp_path: Path) -> None:
    lake = Lake("local", tmp_path / "lake")
    for n in range(5):
        lake.put(f"{HOUR}/{part(1 + n * 50_000)}", events(range(n * 50_000, (n + 1) * 50_000)))
    report = lake.compact()
    merged = lake.root / HOUR / lake.names()[0]
    meta = pq.read_metadata(merged)
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
        100_000, 100_000, 50_000]
    assert meta.row_group(0).column(0).compression == "ZSTD"
    recorded = json.loads(meta.metadata[COMPACTION_META_KEY.encode()])
    assert recorded["inputs"] == report.partitions[0].inputs == [part(1 + n * 50_000)
                                                                  for n in range(5)]
    assert pq.read_schema(merged).remove_metadata().equals(written_schema(EVENT_SCHEMA))


def test_files_younger_than_the_grace_period_are_left_alone(lake: Lake) -> None:
    fill(lake, files=4)
    if lake.kind == "local":
        for n in range(4, 7):  # just written by an agent
            lake.put(f"{HOUR}/{part(1000 + n)}", events(range(1000 + n, 1001 + n)), age_s=5)
    report = lake.compact(settled=False)
    young = {part(1000 + n) for n in range(4, 7)}
    if lake.kind == "s3":  # everything was uploaded just now
        assert report.written_files == 0 and report.partitions[0].young == 4
        assert len(lake.names()) == 4
        # what the command prints says why nothing was merged
        assert "4 files younger than the grace period left for later (--grace)" in str(report)
        return
    assert report.partitions[0].young == 3 and report.merged_files == 4
    assert "3 files younger than the grace period left for later" in str(report)
    assert young < set(lake.names()) and len(lake.names()) == 4
    assert lake.counts() == (203, 203)


def crash_on_delete(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(self: object, keys: list[str]) -> None:
        raise OSError("killed between write and delete")

    monkeypatch.setattr(LocalTarget, "delete", crash)
    monkeypatch.setattr(S3Target, "delete", crash)


def test_crash_between_write_and_delete_is_cleaned_up_next_run(
        lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(lake, files=6)
    with monkeypatch.context() as patched:
        crash_on_delete(patched)
        crashed = lake.compact()
    assert crashed.errors and "killed" in crashed.errors[0]
    assert len(lake.names()) == 7  # the merged file and all its inputs
    assert lake.counts() == (600, 300)  # duplicates until the next run

    report = lake.compact()
    assert (report.written_files, report.deleted_files, report.errors) == (0, 6, [])
    assert len(lake.names()) == 1 and lake.counts() == (300, 300)


def test_recompaction_crash_and_racing_runs_leave_one_file(
        lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(lake, files=3)
    lake.compact()
    lake.settle()
    first = lake.names()
    lake.put(f"{HOUR}/{part(9000)}", events(range(9000, 9010), prefix=f"{HOUR}-"))
    with monkeypatch.context() as patched:
        crash_on_delete(patched)
        lake.compact()  # merges the compacted file and the new part, deletes nothing
    assert len(lake.names()) == 3
    report = lake.compact()  # the old compacted file is a subset of the new one
    assert report.written_files == 0 and report.deleted_files == 2
    assert len(lake.names()) == 1 and lake.names() != first
    assert lake.counts() == (160, 160)


def test_rewritten_input_is_deleted_if_identical_and_merged_once_if_not(lake: Lake) -> None:
    fill(lake, files=3)
    lake.compact()
    lake.put(f"{HOUR}/{part(1)}", events(range(0, 50), prefix=f"{HOUR}-"))  # same content
    lake.settle()
    report = lake.compact()
    assert report.deleted_files == 1 and report.written_files == 0
    assert lake.counts() == (150, 150)
    longer = pa.concat_tables([events(range(0, 50), prefix=f"{HOUR}-"),
                               events(range(500, 530), prefix=f"{HOUR}-")])
    lake.put(f"{HOUR}/{part(1)}", longer)  # a retry that took 30 more events
    lake.settle()
    report = lake.compact()
    assert report.written_files == 1 and report.partitions[0].rows == 180
    assert len(lake.names()) == 1 and lake.counts() == (180, 180)


def test_dry_run_min_files_and_partition_filter(lake: Lake) -> None:
    fill(lake, files=3)
    fill(lake, files=1, partition=OTHER_HOUR)
    before = lake.names(), lake.names(OTHER_HOUR)
    dry = lake.compact(dry_run=True)
    assert dry.merged_files == 3 and "would merge 3 files into 1; would delete 3" in str(dry)
    assert "deleted" not in str(dry) and " rows" not in str(dry)  # nothing was, nor read
    assert (lake.names(), lake.names(OTHER_HOUR)) == before
    assert lake.compact(min_files=4).written_files == 0
    report = lake.compact(partition="date=2026-01-02/hour=04")
    assert [p.partition.rpartition("lake/")[2] for p in report.partitions] == [OTHER_HOUR]
    assert report.written_files == 0  # one file is not worth merging
    assert lake.compact(partition="date=2026-01-02/hour=03").written_files == 1


def test_other_files_are_never_touched(tmp_path: Path) -> None:
    lake = Lake("local", tmp_path / "lake")
    fill(lake, files=3)
    strays = [f"{HOUR}/.evagg-part-x.parquet.tmp", f"{HOUR}/notes.txt",
              "date=2026-01-02/loose.parquet", "elsewhere/a.parquet", "elsewhere/b.parquet"]
    for stray in strays:
        (lake.root / stray).parent.mkdir(parents=True, exist_ok=True)
        (lake.root / stray).write_bytes(b"not ours")
        os.utime(lake.root / stray, (OLD, OLD))
    assert lake.compact().merged_files == 3
    assert all((lake.root / stray).read_bytes() == b"not ours" for stray in strays)


def test_a_broken_partition_does_not_stop_the_others(tmp_path: Path) -> None:
    lake = Lake("local", tmp_path / "lake")
    fill(lake, files=3)
    fill(lake, files=2, partition=OTHER_HOUR)
    broken = lake.root / OTHER_HOUR / part(999)
    broken.write_bytes(b"PAR1 torn")
    os.utime(broken, (OLD, OLD))
    report = lake.compact()
    assert len(report.errors) == 1 and OTHER_HOUR in report.errors[0]
    assert report.written_files == 1 and len(lake.names()) == 1
    assert len(lake.names(OTHER_HOUR)) == 3  # left exactly as it was


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        run_compact(str(tmp_path), min_files=1)
    with pytest.raises(ValueError):
        run_compact(str(tmp_path), partition="date=2026-01-02/../x")
    with pytest.raises(ValueError):
        run_compact(str(tmp_path / "missing"))


def test_evagg_compact_command(tmp_path: Path) -> None:
    lake = Lake("local", tmp_path / "lake")
    fill(lake, files=4)
    done = subprocess.run([sys.executable, "-m", "aggregator", "compact", str(lake.root)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "merged 4 files into 1" in done.stdout
    assert lake.counts() == (200, 200) and len(lake.names()) == 1


def _user_compact(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`evagg compact` in an operator's shell: an empty HOME, no evagg variable but `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    return subprocess.run([sys.executable, "-m", "aggregator", "compact", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**clean, "PYTHONPATH": str(REPO), "HOME": str(home),
                               "XDG_DATA_HOME": str(home / ".local/share"), **env})


def test_evagg_compact_takes_the_lake_evagg_query_reads(tmp_path: Path) -> None:
    """No target: the agent's lake by --config or $EVAGG_CONFIG, else $EVAGG_DATA, as the
    other reading commands choose it; a lake that is not there says what to give."""
    home = tmp_path / "home"
    missing = _user_compact(home)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"evagg compact: data directory {home}/.local/share/evagg/parquet does not exist: "
        "give the agent's config with --config FILE (its Parquet sink's url is read), or the "
        "lake with --data DIR or s3://bucket/prefix (or $EVAGG_DATA)")
    lake = Lake("local", tmp_path / "lake")
    fill(lake, files=4)
    config = tmp_path / "evagg.toml"
    config.write_text(f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake.root}"\n')
    by_config = _user_compact(home, "--dry-run", EVAGG_CONFIG=str(config))
    assert by_config.returncode == 0, by_config.stderr
    assert by_config.stdout.startswith(f"{lake.root}: ") and "would merge 4 files" in (
        by_config.stdout)
    done = _user_compact(home, EVAGG_DATA=str(lake.root))
    assert done.returncode == 0, done.stderr
    assert "merged 4 files into 1" in done.stdout and len(lake.names()) == 1
    twice = _user_compact(home, str(lake.root), "--data", str(tmp_path))
    assert (twice.returncode, twice.stderr.strip()) == (
        2, "evagg compact: give the lake once, as the target or as --data")


def column_layout(path: Path) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Per leaf column of the first row group: its encodings and whether it has statistics."""
    group = pq.ParquetFile(path).metadata.row_group(0)
    layout = {}
    for index in range(group.num_columns):
        chunk = group.column(index)
        layout[chunk.path_in_schema] = (tuple(sorted(chunk.encodings)), chunk.is_stats_set)
    return layout


def test_compacted_files_keep_the_sinks_encodings_and_size(tmp_path: Path) -> None:
    """Merged files used to be written with pyarrow's defaults: 20% larger than the files
    they replaced, with statistics of map entries and stack traces."""
    rows = [{"kind": "op", "name": f"step{i % 3}", "time": 1_767_322_800_000_000_000 + i * 997,
             "step": i // 3, "trace_id": f"{i * 7919:032x}", "duration_s": i / 1000,
             "metrics": {"loss": 1 / (i + 1)}, "attrs": {"rank": str(i % 8)},
             "stack_trace": f"line {i}"} for i in range(6000)]
    table = pa.Table.from_batches([rows_to_batch(rows, Stamp.now("n1", "h")).batch])
    inputs = []
    for index in range(3):
        path = tmp_path / HOUR / part(index * 2000)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_writer(str(path), EVENT_SCHEMA) as writer:  # as the Parquet sink writes
            writer.write_table(table.slice(index * 2000, 2000))
        os.utime(path, (OLD, OLD))
        inputs.append(path)
    sizes = sum(p.stat().st_size for p in inputs)
    layout = column_layout(inputs[0])
    report = run_compact(str(tmp_path), grace_s=0)
    assert report.merged_files == 3 and not report.errors
    merged = next((tmp_path / HOUR).glob("compacted-*.parquet"))
    assert column_layout(merged) == layout
    assert layout["attrs.key_value.value"][1] is False and layout["time"][1] is True
    assert merged.stat().st_size < sizes


def test_a_merge_keeps_each_event_id_once_as_first_seen_and_every_row_without_one(
        tmp_path: Path) -> None:
    def write(name: str, rows: list[dict[str, Any]]) -> Path:
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(rows), path)
        return path

    first = write("a.parquet", [{"event_id": "x", "name": "a-x"},
                                {"event_id": "y", "name": "a-y"},
                                {"event_id": None, "name": "a-none"}])
    second = write("b.parquet", [{"event_id": "y", "name": "b-y"},
                                 {"event_id": "z", "name": "b-z"},
                                 {"event_id": None, "name": "b-none"},
                                 {"event_id": "z", "name": "b-z-again"}])
    idless = write("c.parquet", [{"name": "c-no-column"}])  # a producer's file without ids
    merged = tmp_path / "merged.parquet"
    assert merge_files([first, second, idless], merged, {}) == 6
    assert pq.read_table(merged).to_pylist() == [
        {"event_id": "x", "name": "a-x"}, {"event_id": "y", "name": "a-y"},
        {"event_id": None, "name": "a-none"}, {"event_id": "z", "name": "b-z"},
        {"event_id": None, "name": "b-none"}, {"event_id": None, "name": "c-no-column"}]
