"""The Parquet sink and the local store, with real files read back by DuckDB and pyarrow."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aggregator.decode.ndjson import decode_bulk, decode_careful
from aggregator.decode.normalize import Stamp
from sinks.base import SinkCounter, SinkResult
from sinks.filters import EventFilter
from sinks.options import SinkOptionError
from sinks.parquet import ParquetSink
from sinks.parquet.layout import object_key, partition_for
from sinks.parquet.options import ParquetOptions
from sinks.parquet.stores import LocalStore, is_staging_name
from sinks.parquet.writer import written_schema
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_to_bytes
from tests.sinks.parquet.records import HOUR_NS, SESSION, T10, Clock, duck, record, records


def make_sink(root: Path, store: LocalStore | None = None, *, clock: Clock | None = None,
              event_filter: EventFilter | None = None, **options: Any) -> ParquetSink:
    """A sink on `root` with these ParquetOptions fields."""
    return ParquetSink("lake", store or LocalStore(root), ParquetOptions(**options),
                       node_id="node-a", spool_id="s1", event_filter=event_filter,
                       clock=clock or time.monotonic)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def write_all(
    sink: ParquetSink, batches: Sequence[Sequence[SpoolRecord]], final: bool = True
) -> list[SinkResult]:
    async def go() -> list[SinkResult]:
        results = [await sink.write(batch) for batch in batches]
        if final:
            results.append(await sink.flush(final=True))
        return results

    return list(run(go()))


def parquet_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet"))


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "lake"


def test_partition_and_key_derive_from_the_receive_time_and_first_offset() -> None:
    assert partition_for(T10 + 59 * 60 * 10**9) == "date=2024-05-01/hour=10"
    assert partition_for(T10 + 14 * HOUR_NS) == "date=2024-05-02/hour=00"
    key = object_key(T10, "node-a", "s1", 42)
    assert key == "date=2024-05-01/hour=10/node=node-a/part-s1-00000000000000000042.parquet"
    assert object_key(T10, "odd/node", "s1", 1).split("/")[2] == "node=odd%2Fnode"


def test_files_read_back_with_the_event_schema(root: Path) -> None:
    sink = make_sink(root)
    results = write_all(sink, [records(1, 3)])
    assert results[0] == SinkResult.success(None, 0)  # the file is still open
    assert results[1] == SinkResult.success(3, 300)
    [path] = parquet_files(root)
    assert path.relative_to(root).as_posix() == object_key(T10, "node-a", "s1", 1)
    # the event schema, timestamps in microseconds (the spool and Arrow hold nanoseconds)
    assert pq.read_schema(path).equals(written_schema(EVENT_SCHEMA))
    assert pq.read_schema(path).field("time").type == pa.timestamp("us", tz="UTC")
    types = dict(duck(root, "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM EVENTS)"))
    assert types["metrics"] == "MAP(VARCHAR, DOUBLE)"
    assert types["attrs"] == "MAP(VARCHAR, VARCHAR)"
    assert types["nonfinite"] == "VARCHAR[]"
    assert types["attempt"] == types["pid"] == "INTEGER"
    assert types["time"] == types["received"] == "TIMESTAMP WITH TIME ZONE"
    assert types["node"] == "VARCHAR"
    rows = duck(
        root,
        "SELECT count(*), count(DISTINCT event_id), min(strftime(date, '%Y-%m-%d')), min(hour), "
        "min(node), min(metrics['lr']), min(attrs['zone']), count(nonfinite) FROM EVENTS",
    )
    assert rows == [(300, 300, "2024-05-01", 10, "node-a", 0.001, "eu", 60)]
    table = pq.read_table(path)
    assert table.column("received").cast(pa.int64()).to_pylist() == [T10 // 1000] * 300  # µs
    assert table.column("metrics")[1].as_py() == [("loss", 0.5), ("lr", 0.001)]


def test_rolls_by_bytes_with_one_row_group_in_memory(root: Path) -> None:
    sink = make_sink(root, roll_max_bytes=9_000, row_group_rows=150)
    results = write_all(sink, [[r] for r in records(1, 13)])  # the last result is the final flush
    rolled = [r.durable_through for r in results if r.durable_through is not None]
    assert len([r for r in results[:-1] if r.durable_through is not None]) >= 2  # by size
    assert rolled == sorted(rolled) and rolled[-1] == 13
    files = parquet_files(root)
    assert len(files) == len(rolled)
    firsts = [int(p.stem.rsplit("-", 1)[1]) for p in files]
    assert firsts == [1] + [last + 1 for last in rolled[:-1]]
    for path in files:
        metadata = pq.ParquetFile(path).metadata
        sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        assert all(size == 150 for size in sizes[:-1]) and 0 < sizes[-1] <= 150
    assert duck(root, "SELECT count(*), count(DISTINCT event_id) FROM EVENTS") == [(1300, 1300)]
    counted = {c.name: c.value for c in sink.counters()}
    assert counted["files_written"] == len(files) and counted["events_written"] == 1300
    assert counted["bytes_written"] == sum(path.stat().st_size for path in files)


def test_rolls_by_age_in_flush(root: Path) -> None:
    clock = Clock()
    sink = make_sink(root, roll_interval_s=60, clock=clock)

    async def go() -> list[SinkResult]:
        first = await sink.write(records(1, 2))
        clock.now += 59
        early = await sink.flush()
        clock.now += 1
        due = await sink.flush()
        idle = await sink.flush()
        return [first, early, due, idle]

    first, early, due, idle = run(go())
    assert first.durable_through is None and early.durable_through is None
    assert due == SinkResult.success(2, 200)
    assert idle == SinkResult.success(None, 0)
    assert len(parquet_files(root)) == 1


def test_rolls_when_the_receive_hour_changes(root: Path) -> None:
    sink = make_sink(root)
    late = T10 + HOUR_NS - 1
    results = write_all(
        sink,
        [
            [
                record(1, received_ns=T10),
                record(2, received_ns=late),
                record(3, received_ns=T10 + HOUR_NS),
            ]
        ],
    )
    assert results[0] == SinkResult.success(2, 200)
    assert results[1] == SinkResult.success(3, 100)
    keys = [p.relative_to(root).as_posix() for p in parquet_files(root)]
    assert keys == [
        object_key(T10, "node-a", "s1", 1),
        object_key(T10 + HOUR_NS, "node-a", "s1", 3),
    ]
    assert duck(root, "SELECT hour, count(*) FROM EVENTS GROUP BY hour ORDER BY hour") == [
        (10, 200),
        (11, 100),
    ]


def test_replay_after_abandon_rewrites_the_same_key(root: Path) -> None:
    sink = make_sink(root)

    async def go() -> SinkResult:
        await sink.write(records(1, 3))
        await sink.abandon()
        assert all_files(root) == []  # the staged file is gone
        await sink.write(records(1, 3))
        return await sink.flush(final=True)

    assert run(go()) == SinkResult.success(3, 300)
    # A crash after publishing but before the cursor moved: a new agent replays the same range.
    write_all(make_sink(root), [records(1, 3)])
    assert len(parquet_files(root)) == 1
    assert duck(root, "SELECT count(*), count(DISTINCT event_id) FROM EVENTS") == [(300, 300)]


def test_longer_replay_from_the_same_offset_keeps_one_file_per_first_offset(root: Path) -> None:
    write_all(make_sink(root), [records(1, 3)])
    write_all(make_sink(root), [records(1, 6)])
    [path] = parquet_files(root)
    assert path.name == "part-s1-00000000000000000001.parquet"
    assert duck(root, "SELECT count(*), count(DISTINCT event_id) FROM EVENTS") == [(600, 600)]


def test_filter_keeps_chosen_events_and_filtered_records_still_advance(root: Path) -> None:
    sink = make_sink(root, event_filter=EventFilter.of(kinds=["op"]))
    results = write_all(
        sink,
        [
            [record(1, kinds=["task"]), record(2, kinds=["task"])],  # nothing to keep, no open file
            [record(3, kinds=["task", "op"]), record(4, kinds=["task"])],
        ],
    )
    assert results[0] == SinkResult.success(2, 0)
    assert results[1] == SinkResult.success(None, 0)
    assert results[2] == SinkResult.success(4, 50)  # record 4 rode along in the file
    [path] = parquet_files(root)
    assert path.name.endswith("-00000000000000000003.parquet")
    assert duck(root, "SELECT DISTINCT kind FROM EVENTS") == [("op",)]


class FailingStore(LocalStore):
    def __init__(self, root: Path, error: Exception) -> None:
        super().__init__(root)
        self.error = error
        self.staged: list[Path] = []

    def staging_path(self, key: str) -> Path:
        path = super().staging_path(key)
        self.staged.append(path)
        return path

    async def publish(self, staged: Path, key: str) -> None:
        raise self.error


def test_a_failing_publish_returns_a_failure_and_leaves_no_temp_file(root: Path) -> None:
    store = FailingStore(root, ConnectionError("bucket unreachable"))
    sink = make_sink(root, store=store)

    async def go() -> list[SinkResult]:
        written = await sink.write(records(1, 2))
        assert store.staged[0].exists()
        failed = await sink.flush(final=True)
        await sink.abandon()
        return [written, failed]

    written, failed = run(go())
    assert written.ok
    assert not failed.ok and failed.error_kind == "publish" and not failed.permanent
    assert "bucket unreachable" in (failed.error or "")
    assert SinkCounter("publish_failures", 1, "publish") in sink.counters()
    assert SinkCounter("files_written", 0) in sink.counters()
    assert all_files(root) == []


class StoreDownOnce(LocalStore):
    """A store whose first publish fails, as one met by an outage."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.failures = 1

    async def publish(self, staged: Path, key: str) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("bucket unreachable")
        await super().publish(staged, key)


def test_the_file_a_failed_publish_rebuilds_goes_at_the_loop_s_retry(root: Path) -> None:
    # the loop resends from its cursor after a failure: the rebuilt file is due as soon as
    # it holds what the failed one held, not a roll interval (a minute on S3) after it opens
    clock = Clock()
    sink = make_sink(root, store=StoreDownOnce(root), roll_interval_s=60, clock=clock)

    async def go() -> list[SinkResult]:
        await sink.write(records(1, 2))
        clock.now += 60
        failed = await sink.flush()
        await sink.abandon()
        await sink.write(records(1, 2))  # the resend, a moment later
        retried = await sink.flush()
        return [failed, retried]

    failed, retried = run(go())
    assert not failed.ok
    assert retried == SinkResult.success(2, 200)
    assert len(parquet_files(root)) == 1


def test_a_bad_payload_is_a_permanent_decode_failure(root: Path) -> None:
    sink = make_sink(root)
    bad = SpoolRecord(2, SESSION, 2, T10, 1, b"not arrow")
    [result] = write_all(sink, [[record(1), bad]], final=False)
    assert not result.ok and result.error_kind == "decode" and result.permanent
    assert SinkCounter("write_failures", 1, "decode") in sink.counters()
    assert all_files(root) == []  # the partial file was dropped, the loop resends


def test_a_staging_path_that_cannot_be_written_is_an_io_failure(tmp_path: Path) -> None:
    class NoDirStore(LocalStore):
        def staging_path(self, key: str) -> Path:
            return tmp_path / "missing" / "file.tmp"

    [result] = write_all(
        make_sink(tmp_path, store=NoDirStore(tmp_path)), [records(1, 1)], final=False
    )
    assert not result.ok and result.error_kind == "io"


def test_close_drops_an_unfinished_file(root: Path) -> None:
    sink = make_sink(root)

    async def go() -> None:
        await sink.write(records(1, 1))
        await sink.close()

    run(go())
    assert all_files(root) == []
    assert sink.describe() == f"parquet local:{root} node=node-a"


def test_constructor_rejects_nonsense(root: Path) -> None:
    with pytest.raises(SinkOptionError, match="row_group_rows: 0 must be at least 1"):
        ParquetOptions.from_table({"row_group_rows": 0}, str(root))
    with pytest.raises(ValueError, match="empty"):
        ParquetSink("lake", LocalStore(root), node_id="", spool_id="s1")


def test_local_store_publishes_atomically_and_cleans_stale_staging(root: Path) -> None:
    store = LocalStore(root)
    key = "date=2024-05-01/hour=10/node=n/part-s1-1.parquet"
    staged = store.staging_path(key)
    assert staged.parent == root / "date=2024-05-01" / "hour=10" / "node=n"
    assert is_staging_name(staged.name) and staged.name.startswith(".")
    staged.write_bytes(b"first")
    run(store.publish(staged, key))
    staged = store.staging_path(key)
    staged.write_bytes(b"second")
    run(store.publish(staged, key))
    assert (root / key).read_bytes() == b"second"
    assert not staged.exists()
    store.staging_path("date=2024-05-01/hour=11/node=n/part-s1-2.parquet").write_bytes(b"torn")
    (root / "keep.txt").write_text("not ours")
    assert store.cleanup_staging() == 1
    assert [p.relative_to(root).as_posix() for p in all_files(root)] == [key, "keep.txt"]
    assert LocalStore(root / "absent").cleanup_staging() == 0
    with pytest.raises(FileNotFoundError):
        run(store.publish(root / "gone.tmp", key))
    with pytest.raises(ValueError, match="unsafe"):
        store.staging_path("../escape.parquet")


def test_a_live_writer_whose_staging_file_was_cleaned_retries(root: Path) -> None:
    store = LocalStore(root)
    sink = make_sink(root, store=store)

    async def go() -> list[SinkResult]:
        await sink.write(records(1, 1))
        assert store.cleanup_staging() == 1  # another agent starting on the same root
        failed = await sink.flush(final=True)
        await sink.abandon()
        await sink.write(records(1, 1))
        return [failed, await sink.flush(final=True)]

    failed, retried = run(go())
    assert failed.error_kind == "publish"
    assert retried == SinkResult.success(1, 100)
    assert os.path.basename(parquet_files(root)[0]) == "part-s1-00000000000000000001.parquet"


def test_bulk_and_careful_decoding_give_the_same_rows_on_disk(tmp_path: Path) -> None:
    lines = [
        {
            "event_id": f"e-{i}",
            "time": T10 + i,
            "kind": "op",
            "name": f"op-{i % 3}",
            "step": i,
            "metrics": {"loss": 1.5 / (i + 1)} if i % 2 else {"lr": 0.1, "tokens": 4096},
            "attrs": {"zone": "eu"},
            "gpu": i % 8,
            "pid": 1,
        }
        for i in range(500)
    ]
    payload = b"\n".join(orjson.dumps(line) for line in lines)
    stamp = Stamp(received_ns=T10 + 10**9, pid=4242, uid=1000, node_id="node-a", host="h")
    batches = {"bulk": decode_bulk(payload, stamp), "careful": decode_careful(payload, stamp).batch}
    for path, batch in batches.items():
        ipc = batch_to_bytes(batch)
        spooled = SpoolRecord(1, SESSION, 1, stamp.received_ns, batch.num_rows, ipc)
        write_all(make_sink(tmp_path / path), [[spooled]])
    bulk, careful = (f"read_parquet('{tmp_path / p}/**/*.parquet')" for p in batches)
    with duckdb.connect() as con:
        differ = f"SELECT count(*) FROM (SELECT * FROM {bulk} EXCEPT ALL SELECT * FROM {careful})"
        assert con.execute(differ).fetchall() == [(0,)]
        row = f"SELECT pid, attrs['gpu'], metrics FROM {bulk} WHERE event_id = 'e-1'"
        assert con.execute(row).fetchall() == [(4242, "1", {"loss": 0.75})]


def test_gauges_say_what_is_not_in_the_lake_yet_and_when_it_will_be(tmp_path: Path) -> None:
    clock = Clock()
    sink = make_sink(tmp_path, clock=clock, roll_interval_s=5.0)
    assert sink.gauges() == {"open_file_events": 0.0, "file_closes_in_seconds": 0.0}

    async def go() -> None:
        await sink.write([record(1, 40)])
        clock.now += 2.0
        assert sink.gauges() == {"open_file_events": 40.0, "file_closes_in_seconds": 3.0}
        clock.now += 3.5
        result = await sink.flush()
        assert result.ok and result.durable_through == 1
        assert sink.gauges()["open_file_events"] == 0.0

    run(go())
    assert len(parquet_files(tmp_path)) == 1
