"""Closed hours merged in the background: one file per hour and node, every event once,
on a local directory and on moto's S3; a failure is counted and tried again."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sinks.parquet import ParquetSink
from sinks.parquet.hour_compaction import HourCompaction
from sinks.parquet.layout import partition_for
from sinks.parquet.options import ParquetOptions, S3Options
from sinks.parquet.s3 import S3Store
from sinks.parquet.stores import LocalStore, ObjectStore
from tests.agentproc import AgentProcess, query_lake
from tests.sinks.moto_server import MotoS3, aws_env
from tests.sinks.parquet.records import HOUR_NS, T10, Clock, duck, record

FILES_PER_HOUR = 12


def fill_two_hours(store: ObjectStore, compaction: HourCompaction) -> int:
    """Write FILES_PER_HOUR files into each of two old hours, as 5 s rolls would, and one
    file into the hour after them, which the sink is still writing; returns the events
    written into the two hours."""
    clock = Clock()
    sink = ParquetSink("lake", store, ParquetOptions(roll_interval_s=5.0), node_id="node-a",
                       spool_id="s1", clock=clock, compaction=compaction)

    async def go() -> int:
        offset = written = 0
        for hour in (0, 1):
            for _ in range(FILES_PER_HOUR):
                offset += 1
                await sink.write([record(offset, 50, received_ns=T10 + hour * HOUR_NS)])
                written += 50
                clock.now += 6.0
                result = await sink.flush()
                assert result.ok, result
        await sink.write([record(offset + 1, 10, received_ns=T10 + 2 * HOUR_NS)])
        await sink.flush(final=True)
        return written

    return asyncio.run(go())


def merge_everything_due(compaction: HourCompaction) -> None:
    """One poke once the sink's own pokes are done, as the next flush gives: it merges
    every hour due, not one per flush."""
    assert compaction.wait_idle(60.0)
    compaction.poke()
    assert compaction.wait_idle(60.0)


WRITING = "date=2024-05-01/hour=12/node=node-a/part-s1-00000000000000000025.parquet"


def test_each_closed_hour_becomes_one_file_with_every_event_once(tmp_path: Path) -> None:
    compaction = HourCompaction(str(tmp_path), "node-a", s3=S3Options(), after_s=0.0)
    sent = fill_two_hours(LocalStore(tmp_path), compaction)
    compaction.look_back()  # as at a start: the last day's hours, all empty here
    merge_everything_due(compaction)

    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert [f.rsplit("/", 1)[0] for f in files] == [
        "date=2024-05-01/hour=10/node=node-a", "date=2024-05-01/hour=11/node=node-a",
        "date=2024-05-01/hour=12/node=node-a"]
    assert all(f.rsplit("/", 1)[1].startswith("compacted-") for f in files[:2])
    assert files[2] == WRITING  # the hour still being written is left alone
    (rows, ids), = duck(tmp_path, "SELECT count(*), count(DISTINCT event_id) FROM EVENTS")
    assert rows == ids == sent + 10
    counts = {(c.name, c.reason): c.value for c in compaction.counters()}
    assert counts[("compacted_files", None)] == 2 * FILES_PER_HOUR
    assert not any(name == "compaction_failures" for name, _ in counts)


def test_an_hour_is_merged_only_once_it_has_been_closed_for_the_grace(tmp_path: Path) -> None:
    now = [T10 / 1e9 + 1800]  # half-way through hour 10
    compaction = HourCompaction(str(tmp_path), "node-a", s3=S3Options(), after_s=600.0,
                                clock=lambda: now[0])
    compaction.file_published(T10)
    compaction.file_published(T10 + HOUR_NS)  # the sink has moved on to hour 11
    compaction.poke()
    assert compaction.wait_idle(5.0) and compaction.runs == 0
    now[0] = T10 / 1e9 + 3600 + 599
    compaction.poke()
    assert compaction.wait_idle(5.0) and compaction.runs == 0
    now[0] += 2
    compaction.poke()
    assert compaction.wait_idle(5.0) and compaction.runs == 1


def test_files_too_young_to_merge_are_merged_at_a_later_run_of_their_hour(
        tmp_path: Path) -> None:
    """A backlog replayed into a closed hour after a restart writes files the grace keeps
    out of the merge: the hour is due again, not forgotten until the next start."""
    now = [time.time()]
    compaction = HourCompaction(str(tmp_path), "node-a", s3=S3Options(), after_s=60.0,
                                clock=lambda: now[0])
    fill_two_hours(LocalStore(tmp_path), compaction)  # hours 10 and 11, long closed
    merge_everything_due(compaction)  # every file was written just now: all too young
    assert compaction.merged_files == 0
    assert "date=2024-05-01/hour=10" in compaction._due_at
    old = time.time() - 3600
    for path in tmp_path.rglob("part-*.parquet"):
        os.utime(path, (old, old))
    now[0] += 61
    merge_everything_due(compaction)
    assert compaction.merged_files == 2 * FILES_PER_HOUR
    assert len(list(tmp_path.glob("date=*/hour=1[01]/node=node-a/compacted-*.parquet"))) == 2


def test_the_last_hour_of_a_sink_gone_quiet_is_merged_too() -> None:
    now = [T10 / 1e9 + 3600 + 700]  # hour 10 closed 700 s ago
    compaction = HourCompaction("/nonexistent/lake", "node-a", s3=S3Options(), after_s=600.0,
                                clock=lambda: now[0])
    compaction.file_published(T10 + 3599 * 10**9)  # its last file, in hour 10
    compaction.poke()
    assert compaction.wait_idle(5.0) and "date=2024-05-01/hour=10" in compaction._due_at
    now[0] += 600  # nothing written for 600 s: the hour is merged (nothing there, here)
    compaction.poke()
    assert compaction.wait_idle(5.0) and compaction._due_at == {}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3()
    server.start()
    yield server
    server.stop()


def test_closed_hours_on_s3_are_merged_the_same_way(moto: MotoS3, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    bucket = moto.create_bucket()
    s3 = S3Options(endpoint_url=moto.endpoint_url, region="us-east-1", path_style=True)
    url = f"s3://{bucket}/lake/"
    compaction = HourCompaction(url, "node-a", s3=s3, after_s=0.0)
    sent = fill_two_hours(S3Store(url, s3, staging_dir=tmp_path), compaction)
    merge_everything_due(compaction)

    every = moto.keys(bucket)
    keys = [k for k in every if not k.startswith("lake/_tasks/")]
    assert len(keys) == 3 and all("/compacted-" in k for k in keys[:2]), keys
    assert keys[2] == f"lake/{WRITING}"
    # each merged hour has its task fragment, named after its compacted file
    fragments = sorted(k for k in every if k.startswith("lake/_tasks/"))
    assert fragments == [k.replace("lake/", "lake/_tasks/", 1).replace(".parquet", ".pq")
                         for k in keys[:2]]
    (rows, ids), = moto.duckdb().execute(
        f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet('{url}**/*.parquet')"
    ).fetchall()
    assert rows == ids == sent + 10


def test_a_failed_merge_is_counted_logged_once_and_tried_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [T10 / 1e9 + 7200]
    unreachable = S3Options(endpoint_url="http://127.0.0.1:9", region="us-east-1",
                            path_style=True)
    compaction = HourCompaction("s3://nowhere/lake/", "node-a", s3=unreachable,
                                after_s=60.0, clock=lambda: now[0])
    compaction.file_published(T10)
    compaction.file_published(T10 + 2 * HOUR_NS)
    with caplog.at_level(logging.WARNING, logger="evagg.sinks.parquet.merge"):
        for _ in range(3):
            compaction.poke()
            assert compaction.wait_idle(60.0)
            now[0] += 61  # due again after after_s
    failures = [c for c in compaction.counters() if c.name == "compaction_failures"]
    assert sum(c.value for c in failures) == 3
    assert len([r for r in caplog.records if "merging the closed hour" in r.message]) == 1
    assert "date=2024-05-01/hour=10" in caplog.records[0].getMessage()


def test_nothing_is_merged_before_anything_is_written(tmp_path: Path) -> None:
    compaction = HourCompaction(str(tmp_path / "not-yet"), "node-a", s3=S3Options(),
                                after_s=0.0, clock=lambda: 10**10)
    merge_everything_due(compaction)
    assert compaction.counters()[0].value == 0  # no runs, and no failures either
    assert not [c for c in compaction.counters() if c.name == "compaction_failures"]




def test_a_real_agent_merges_the_hours_it_wrote_before_its_restart(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """An agent that starts finds the small files an earlier run of it left in a closed
    hour of its node, and merges them: one file, every event once, counted on /metrics."""
    agent = agent_factory(sinks_toml='[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                                     'url = "{lake}"\ncompact_after = "1s"\n')
    two_hours_ago = (time.time_ns() // HOUR_NS - 2) * HOUR_NS
    earlier = ParquetSink("lake", LocalStore(agent.lake_dir), ParquetOptions(),
                          node_id="test-node", spool_id="earlier")

    async def leave_small_files() -> None:
        for offset in range(1, 7):
            await earlier.write([record(offset, 25, received_ns=two_hours_ago)])
            await earlier.flush(final=True)

    asyncio.run(leave_small_files())
    files = list(agent.lake_dir.rglob("*.parquet"))
    assert len(files) == 6
    for path in files:  # written an hour ago, as the earlier run would have
        os.utime(path, (time.time() - 3600, time.time() - 3600))

    agent.start()
    deadline = time.monotonic() + 60
    while agent.metric('evagg_sink_compacted_files_total{sink="lake"') < 6:
        assert time.monotonic() < deadline, agent.log()
        time.sleep(0.5)
    hour_dir = agent.lake_dir / partition_for(two_hours_ago) / "node=test-node"
    merged = list(hour_dir.glob("*.parquet"))
    assert [p.name[:10] for p in merged] == ["compacted-"], merged
    assert query_lake(agent.lake_dir, "SELECT count(*), count(DISTINCT event_id) FROM events "
                      "WHERE source = 'test'") == [(150, 150)]  # the agent's heartbeats aside
    assert agent.metric('evagg_sink_compaction_runs_total{sink="lake"') >= 1
    assert agent.metric('evagg_sink_compaction_failures_total{') == 0
    assert agent.stop() == 0


def test_a_failing_merge_is_not_retried_within_one_poke(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # With no grace (compact_after near 0) a failed hour is due again at once: the retry
    # waits for the next poke, as a flush gives, instead of spinning in the thread.
    calls: list[str] = []

    def failing(*_: object, **__: object) -> None:
        calls.append("merge")
        raise OSError("bucket unreachable")

    monkeypatch.setattr("sinks.parquet.hour_compaction.run_compact", failing)
    compaction = HourCompaction(str(tmp_path), "node-a", s3=S3Options(), after_s=0.0,
                                clock=lambda: T10 / 1e9 + 7200)
    compaction.file_published(T10)
    compaction.file_published(T10 + 2 * HOUR_NS)  # the hour written now is left alone
    compaction.poke()
    assert compaction.wait_idle(5.0)
    assert calls == ["merge"] and compaction.failures == {"oserror": 1}
