"""The agent's hour merge on S3 stages an hour on the state directory's disk, not in /tmp.

A merge downloads every file of a closed node-hour and writes the merged file beside
them before uploading it: as much disk as the hour, twice. The DaemonSet's /tmp is an
emptyDir of 256 MiB (past it the kubelet evicts the pod), and many hosts' /tmp is a
tmpfs in memory; the state directory is the disk the operator sized for a backlog. Here
the agent's TMPDIR is a tmpfs with 256 KiB free while the hour it merges is larger: the
merge must still succeed, with no failure counted. What a merge killed midway left there
is deleted by the next run, since nothing else would. A merge the state directory's disk
has no room for waits, counted and shown by `evagg status`, rather than fill the disk
the spool writes to, and is merged once there is room.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sinks.parquet import ParquetSink
from sinks.parquet.layout import node_directory, partition_for
from sinks.parquet.options import ParquetOptions, S3Options
from sinks.parquet.s3 import S3Store
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_to_bytes
from tests.agentproc import AgentProcess
from tests.commands import evagg
from tests.producers import producer_report, start_producer
from tests.proof.disk import fill, tmpfs
from tests.sinks.moto_server import REGION, MotoS3, aws_env
from tests.waiting import wait_until

NODE = "test-node"  # AgentProcess's node_id: the earlier run's files are its own
HOUR_NS = 3600 * 10**9
FILES = 4
ROWS_PER_FILE = 2000  # each row carries 200 random hex characters: ~0.5 MiB a file
ROOM = 256 * 1024  # what the agent's TMPDIR has free


@pytest.fixture
def small_tmp(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with ROOM bytes free, as the agent's TMPDIR."""
    with tmpfs(tmp_path / "tmp", "4m") as tmp:
        fill(tmp / "taken", leave=ROOM)
        yield tmp


@pytest.fixture
def small_state_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs for the agent's work directory: room for its spool, not for a
    merge and the margin it leaves the spool."""
    with tmpfs(tmp_path / "disk", "48m") as disk:
        yield disk


def rows(file: int, received_ns: int) -> list[dict[str, Any]]:
    return [{"event_id": f"e-{file}-{i}", "time": received_ns - 1000, "kind": "task",
             "source": "python", "name": "work", "state": "FINISHED",
             "task_id": f"t-{file}-{i}", "node_id": NODE, "duration_s": 0.5,
             "error_message": secrets.token_hex(100), "received": received_ns}
            for i in range(ROWS_PER_FILE)]


def leave_a_large_hour(store: S3Store, hour_start_ns: int) -> None:
    """What an earlier run of this agent left in a closed hour: FILES files."""
    earlier = ParquetSink("lake", store, ParquetOptions(), node_id=NODE, spool_id="earlier")

    async def write() -> None:
        for f in range(FILES):
            received = hour_start_ns + (f + 1) * 300 * 10**9
            batch = pa.RecordBatch.from_pylist(rows(f, received), schema=EVENT_SCHEMA)
            record = SpoolRecord(f + 1, bytes(16), f + 1, received, batch.num_rows,
                                 batch_to_bytes(batch))
            assert (await earlier.write([record])).ok
            assert (await earlier.flush(final=True)).ok

    asyncio.run(write())


@dataclass
class LakeHour:
    """A bucket on moto's server holding a closed hour of FILES files an earlier run of
    this node's agent left."""

    moto: MotoS3
    bucket: str
    directory: str  # the hour's folder of this node, relative to the lake

    def names(self) -> list[str]:
        prefix = f"lake/{self.directory}/"
        return sorted(k.removeprefix(prefix) for k in self.moto.keys(self.bucket, prefix)
                      if "/" not in k.removeprefix(prefix))

    def bytes(self) -> int:
        listed = self.moto.client().list_objects_v2(Bucket=self.bucket,
                                                     Prefix=f"lake/{self.directory}/")
        return sum(int(o["Size"]) for o in listed["Contents"])

    def agent(self, workdir: Path, env: dict[str, str]) -> AgentProcess:
        """An agent of this node whose Parquet sink is the lake, merging after 1 s."""
        sinks = (f'[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                 f'url = "s3://{self.bucket}/lake/"\nendpoint_url = "{self.moto.endpoint_url}"\n'
                 'path_style = true\ncompact_after = "1s"\nretry_max_backoff = "2s"\n')
        workdir.mkdir()
        return AgentProcess(workdir, sinks_toml=sinks, env={**aws_env(), **env})


@pytest.fixture
def lake_hour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LakeHour]:
    moto = MotoS3().start()
    try:
        for key, value in aws_env().items():
            monkeypatch.setenv(key, value)
        bucket = moto.create_bucket()
        s3 = S3Options(endpoint_url=moto.endpoint_url, region=REGION, path_style=True)
        store = S3Store(f"s3://{bucket}/lake/", s3, staging_dir=tmp_path / "writer")
        hour_ns = (time.time_ns() // HOUR_NS - 2) * HOUR_NS  # closed, not the live hour
        leave_a_large_hour(store, hour_ns)
        time.sleep(2.0)  # older than compact_after
        yield LakeHour(moto, bucket, f"{partition_for(hour_ns)}/{node_directory(NODE)}")
    finally:
        moto.stop()


def status_line(agent: AgentProcess) -> str:
    """The lake sink's line of `evagg status`, as the operator runs it."""
    done = evagg("status", "--config", str(agent.config_path))
    return next((line for line in done.stdout.splitlines() if line.startswith("sink lake")),
                done.stdout + done.stderr)


def merge_and_stop(agent: AgentProcess, hour: LakeHour) -> None:
    """Start the agent, wait until it merged the hour (or failed to), stop it with 0."""
    agent.start(timeout=120)
    try:
        def merged_or_failed() -> bool:
            return (agent.metric("evagg_sink_compaction_failures_total{") > 0
                    or agent.metric('evagg_sink_compacted_files_total{sink="lake"') >= FILES)

        wait_until(merged_or_failed, 180, lambda: f"a merge of {hour.directory}:\n{agent.log()}",
                   interval=0.5)
        assert agent.metric("evagg_sink_compaction_failures_total{") == 0, agent.log()
        wait_until(lambda: len(hour.names()) == 1, 60,
                   lambda: f"one file in {hour.directory}: {hour.names()}")
        assert hour.names()[0].startswith("compacted-")
        assert agent.stop(timeout=120) == 0, agent.log()
    finally:
        if agent.running:
            agent.kill()


def test_an_hour_larger_than_tmp_is_merged_on_the_state_disk(
        small_tmp: Path, lake_hour: LakeHour, tmp_path: Path) -> None:
    assert lake_hour.bytes() > ROOM  # the hour outgrows the agent's /tmp
    agent = lake_hour.agent(tmp_path / "agent", {"TMPDIR": str(small_tmp)})
    merge_and_stop(agent, lake_hour)


def test_what_a_merge_killed_midway_left_is_deleted_by_the_next_run(
        lake_hour: LakeHour, tmp_path: Path) -> None:
    """A kill -9 during a merge leaves its downloads in the state directory; the next
    agent deletes them before its first merge, and keeps its own merge's folder working."""
    agent = lake_hour.agent(tmp_path / "agent", {})
    staging = agent.state_dir / "staging" / "lake"
    left = staging / "evagg-merge-0123456789ab-compact-x1y2z3"  # an earlier process's
    left.mkdir(parents=True)
    (left / "input-0.parquet").write_bytes(bytes(1 << 20))
    merge_and_stop(agent, lake_hour)
    assert not left.exists(), sorted(p.name for p in staging.iterdir())
    assert [p.name for p in staging.iterdir() if p.is_dir()] == []


def test_a_merge_the_state_disk_has_no_room_for_waits_and_ingest_goes_on(
        small_state_disk: Path, lake_hour: LakeHour) -> None:
    """Before, the merge downloaded the hour onto the spool's disk whatever it had free:
    a busy hour filled it, and the spool refused every event until the merge ended."""
    agent = lake_hour.agent(small_state_disk / "agent", {})
    agent.start(timeout=120)
    try:
        no_room = 'evagg_sink_compaction_failures_total{reason="no_room"'
        wait_until(lambda: agent.metric(no_room) > 0, 180,
                   lambda: f"the merge to wait for room:\n{agent.log()[-3000:]}", interval=0.5)
        assert len(hour_files := lake_hour.names()) == FILES, hour_files  # left as they are
        said = next(line for line in agent.log().splitlines() if "(no_room)" in line)
        assert "not merged: it needs " in said and "MiB more left for the spool and the " \
            "sinks' files; the disk has " in said, said
        assert "free: give it room; it is tried again in 1s" in said, said
        staging = agent.state_dir / "staging" / "lake"
        assert not any(p.is_dir() for p in staging.iterdir()), list(staging.iterdir())
        # and the spool takes events meanwhile (acked: stored)
        assert producer_report(start_producer(agent.socket_path, "after", 5))["flushed"]
        # `evagg status` says so on the sink's line, and no longer once the disk has room
        said = status_line(agent)
        assert "  1 closed hour not merged (failures so far: no_room=" in said, said
        subprocess.run(["mount", "-o", "remount,size=256m", str(small_state_disk)], check=True)
        wait_until(lambda: len(lake_hour.names()) == 1, 180,
                   lambda: f"the merge once there is room:\n{agent.log()[-3000:]}", interval=0.5)
        wait_until(lambda: "not merged" not in status_line(agent), 30,
                   lambda: f"status to forget the hour: {status_line(agent)}")
        assert agent.metric('evagg_sink_partitions_not_merged{sink="lake"') == 0
        assert agent.stop(timeout=120) == 0, agent.log()
    finally:
        if agent.running:
            agent.kill()
