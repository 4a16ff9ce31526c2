"""The hour merge through a real `evagg run`, on a local lake and on moto's S3.

An earlier run of the agent left small files in a closed hour of its node, task events
split over them (a task's RUNNING in one file, its end in the next, one end resent). The
agent that starts looks back at the last day's hours, merges that one into one compacted
file with its task fragment in `_tasks/` (compact_after = 1s), and counts it on /metrics;
meanwhile it takes live task events. `evagg query sql` over the lake (the fold reading the
fragment) then answers as it does over a copy of the lake without `_tasks/` (the fold
reading every raw event), and as what was sent. SIGTERM stops the agent with 0.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from dashboard.lake.store import Store, StoreOptions
from sinks.parquet import ParquetSink
from sinks.parquet.layout import TASKS_ROOT, fragment_key, node_directory, partition_for
from sinks.parquet.options import ParquetOptions, S3Options
from sinks.parquet.s3 import S3Store
from sinks.parquet.stores import LocalStore, ObjectStore
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_to_bytes
from tests.agentproc import REPO, AgentProcess, short_socket_dir
from tests.sinks.moto_server import REGION, MotoS3, aws_env
from tests.waiting import wait_for, wait_until

NODE = "test-node"  # AgentProcess's [agent] node_id: the earlier run's files are its own
HOUR_NS = 3600 * 10**9
PAST_FILES = 6
PAST_TASKS = 12
QUERY = ("SELECT name, final_state, count(*), sum(duration_s) FROM tasks "
         "GROUP BY ALL ORDER BY ALL")
MERGE_TIMEOUT_S = 180.0  # a loaded 2-core machine: an agent start, 24 listings, a merge
Answer = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Task:
    task_id: str
    name: str
    state: str  # FINISHED or FAILED
    duration_s: float  # quarters: sums are exact whatever order they are added in
    error_type: str | None


def past_tasks() -> list[Task]:
    names = ("load", "train", "score")
    return [Task(f"past-{i}", names[i % 3], "FAILED" if i % 4 == 3 else "FINISHED",
                 0.25 * (i + 1), ("ValueError", "OOMError")[i % 2] if i % 4 == 3 else None)
            for i in range(PAST_TASKS)]


def live_tasks() -> list[Task]:
    return [Task(f"live-{i}", ("train", "serve")[i % 2], "FAILED" if i == 2 else "FINISHED",
                 0.5 * (i + 1), "TimeoutError" if i == 2 else None) for i in range(5)]


def expected_answer(tasks: list[Task]) -> Answer:
    groups: dict[tuple[str, str], tuple[int, float]] = {}
    for task in tasks:
        count, seconds = groups.get((task.name, task.state), (0, 0.0))
        groups[(task.name, task.state)] = (count + 1, seconds + task.duration_s)
    return sorted((name, state, count, seconds)
                  for (name, state), (count, seconds) in groups.items())


def task_row(task: Task, state: str, received_ns: int, event_id: str) -> dict[str, Any]:
    end = state != "RUNNING"
    return {"event_id": event_id, "time": received_ns - 1000, "kind": "task",
            "source": "python", "name": task.name, "state": state, "task_id": task.task_id,
            "attempt": 0, "job_id": "job-1", "run_id": "earlier", "node_id": NODE,
            "host": "host-a", "duration_s": task.duration_s if end else None,
            "error_type": task.error_type if end else None,
            "error_message": f"{task.error_type}: boom" if end and task.error_type else None,
            "received": received_ns}


def past_records(hour_start_ns: int) -> list[SpoolRecord]:
    """One spool record per file, 5 min apart inside the hour: task i RUNNING in file
    i % 5 and ended in the next one; task 0's end resent in the last file, as a retrying
    emitter would (the same event_id)."""
    rows: list[list[dict[str, Any]]] = [[] for _ in range(PAST_FILES)]
    received = [hour_start_ns + (f + 1) * 300 * 10**9 for f in range(PAST_FILES)]
    for i, task in enumerate(past_tasks()):
        first = i % (PAST_FILES - 1)
        rows[first].append(task_row(task, "RUNNING", received[first], f"run-{i}"))
        rows[first + 1].append(task_row(task, task.state, received[first + 1], f"end-{i}"))
    rows[-1].append(task_row(past_tasks()[0], "FINISHED", received[-1], "end-0"))
    out = []
    for f, file_rows in enumerate(rows):
        batch = pa.RecordBatch.from_pylist(file_rows, schema=EVENT_SCHEMA)
        out.append(SpoolRecord(f + 1, bytes(16), f + 1, received[f], len(file_rows),
                               batch_to_bytes(batch)))
    return out


def leave_files_of_an_earlier_run(store: ObjectStore, hour_start_ns: int) -> None:
    """What an earlier run of this agent left: a file per spool record, with the sink's
    own writer and keys."""
    earlier = ParquetSink("lake", store, ParquetOptions(), node_id=NODE, spool_id="earlier")

    async def write() -> None:
        for record in past_records(hour_start_ns):
            assert (await earlier.write([record])).ok
            assert (await earlier.flush(final=True)).ok

    asyncio.run(write())


class Lake:
    """Where the agent writes, as the test sees it."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None

    def names(self, directory: str) -> list[str]:
        """File names directly in `directory` (relative to the lake)."""
        raise NotImplementedError

    def age_files(self) -> None:
        """Until every file is older than the agent's compact_after (the merge leaves a
        younger one alone, as one a retrying agent might still rewrite)."""
        raise NotImplementedError

    def copy_without_tasks(self) -> str:
        """A copy of the lake without `_tasks/`: its url."""
        raise NotImplementedError

    def store(self) -> ObjectStore:
        raise NotImplementedError


class LocalLake(Lake):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    def names(self, directory: str) -> list[str]:
        folder = self.root / directory
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def age_files(self) -> None:
        hour_ago = time.time() - 3600
        for path in self.root.rglob("*.parquet"):
            os.utime(path, (hour_ago, hour_ago))

    def copy_without_tasks(self) -> str:
        copy = self.root.with_name("raw-lake")
        shutil.copytree(self.root, copy, ignore=lambda folder, _: (
            [TASKS_ROOT] if Path(folder) == self.root else []))
        return str(copy)

    def store(self) -> ObjectStore:
        return LocalStore(self.root)


class S3Lake(Lake):
    def __init__(self, moto: MotoS3, bucket: str, staging: Path) -> None:
        self.moto, self.bucket, self.staging = moto, bucket, staging
        self.url = f"s3://{bucket}/lake/"
        self.endpoint_url, self.region = moto.endpoint_url, REGION

    def names(self, directory: str) -> list[str]:
        prefix = f"lake/{directory}/"
        return sorted(k.removeprefix(prefix) for k in self.moto.keys(self.bucket, prefix)
                      if "/" not in k.removeprefix(prefix))

    def age_files(self) -> None:
        client = self.moto.client()

        def old_enough() -> bool:
            listed = client.list_objects_v2(Bucket=self.bucket, Prefix="lake/")
            newest: float = max(o["LastModified"].timestamp() for o in listed["Contents"])
            return time.time() - newest > 2.0

        wait_until(old_enough, 30, "the earlier run's objects to be 2 s old", interval=0.2)

    def copy_without_tasks(self) -> str:
        client = self.moto.client()
        for key in self.moto.keys(self.bucket, "lake/"):
            if not key.startswith(f"lake/{TASKS_ROOT}/"):
                client.copy_object(Bucket=self.bucket, Key="raw/" + key.removeprefix("lake/"),
                                   CopySource={"Bucket": self.bucket, "Key": key})
        return f"s3://{self.bucket}/raw/"

    def store(self) -> ObjectStore:
        s3 = S3Options(endpoint_url=self.moto.endpoint_url, region=REGION, path_style=True)
        return S3Store(self.url, s3, staging_dir=self.staging)

    def sink_toml(self) -> str:
        return (f'url = "{self.url}"\nendpoint_url = "{self.moto.endpoint_url}"\n'
                'path_style = true\nretry_max_backoff = "2s"\n')


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture
def user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A home of its own, no EVAGG_* settings from outside; the agent and every command
    run with it (AgentProcess adds its env to this process's environment)."""
    for key in [k for k in os.environ if k.startswith("EVAGG_")]:
        monkeypatch.delenv(key)
    home = tmp_path / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local/share"),
           "XDG_STATE_HOME": str(home / ".local/state"),
           "XDG_RUNTIME_DIR": str(short_socket_dir())}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    return env


def evagg_query(lake_url: str, endpoint_url: str | None, env: dict[str, str]) -> Answer:
    """`evagg query sql QUERY --json` in a subprocess, as a user types it."""
    flags = ["--endpoint-url", endpoint_url] if endpoint_url else []
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", "query", "--data", lake_url, *flags, "sql",
         QUERY, "--json"], capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return [tuple(row.values()) for row in orjson.loads(done.stdout)]


def post_events(agent: AgentProcess, events: list[dict[str, Any]]) -> None:
    body = b"".join(orjson.dumps(event) + b"\n" for event in events)
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


def send_live_tasks(agent: AgentProcess) -> None:
    """Every live task's RUNNING, then (another request, another file) its end."""
    tasks = live_tasks()
    post_events(agent, [{"kind": "task", "name": t.name, "state": "RUNNING",
                         "task_id": t.task_id, "job_id": "job-2"} for t in tasks])
    post_events(agent, [{"kind": "task", "name": t.name, "state": t.state,
                         "task_id": t.task_id, "job_id": "job-2", "duration_s": t.duration_s,
                         **({"error_type": t.error_type, "error_message": "too slow"}
                            if t.error_type else {})} for t in tasks])


def merged(lake: Lake, agent: AgentProcess, directory: str) -> str | None:
    """The compacted file of `directory` once it is alone there, its fragment is in
    `_tasks/` and /metrics counts the merge of every input; else None."""
    names = lake.names(directory)
    if len(names) != 1 or not names[0].startswith("compacted-"):
        return None
    fragment_dir, fragment = fragment_key(directory, names[0]).rsplit("/", 1)
    if fragment not in lake.names(fragment_dir):
        return None
    if agent.metric('evagg_sink_compacted_files_total{sink="lake"') < PAST_FILES:
        return None
    return names[0]


def folded_answer(store: Store) -> Answer:
    store.refresh(force=True)
    return [tuple(row) for row in store.execute(QUERY).rows]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_agent_merges_an_hour_its_earlier_run_left_and_queries_answer_the_same(
        where: str, agent_factory: Callable[..., AgentProcess], user_env: dict[str, str],
        tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fast = 'roll_interval = "1s"\ncompact_after = "1s"\n'
    lake: Lake
    if where == "s3":
        moto: MotoS3 = request.getfixturevalue("moto")
        for key, value in aws_env().items():
            monkeypatch.setenv(key, value)
        user_env.update(aws_env())
        s3_lake = S3Lake(moto, moto.create_bucket(), tmp_path / "staging")
        sinks = f'[[sinks]]\nname = "lake"\ntype = "parquet"\n{s3_lake.sink_toml()}{fast}'
        agent = agent_factory(sinks_toml=sinks, env=user_env)
        lake = s3_lake
    else:
        agent = agent_factory(sinks_toml='[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                                         f'url = "{{lake}}"\n{fast}', env=user_env)
        lake = LocalLake(agent.lake_dir)

    # two hours back: closed, and not the hour the live events go to even if an hour
    # ends while the test runs
    past_hour_ns = (time.time_ns() // HOUR_NS - 2) * HOUR_NS
    directory = f"{partition_for(past_hour_ns)}/{node_directory(NODE)}"
    leave_files_of_an_earlier_run(lake.store(), past_hour_ns)
    inputs = lake.names(directory)
    assert len(inputs) == PAST_FILES and all(n.startswith("part-earlier-") for n in inputs)
    lake.age_files()

    agent.start(timeout=120)
    send_live_tasks(agent)
    compacted = wait_for(lambda: merged(lake, agent, directory), MERGE_TIMEOUT_S,
                         lambda: f"the merge of {directory}: {lake.names(directory)}\n"
                                 f"{agent.log()}", interval=0.5)
    assert compacted not in inputs
    assert agent.metric('evagg_sink_compaction_runs_total{sink="lake"') >= 1
    assert agent.metric('evagg_sink_compaction_failures_total{') == 0

    # the readers: the fold takes the merged hour from its fragment, and the live tasks
    # are in once their files are published (polled through pyarrow, the quicker reader
    # of moto; `evagg query` below reads as a user's does, with the default engine)
    expected = expected_answer(past_tasks() + live_tasks())
    store = Store(StoreOptions(lake.url, endpoint_url=lake.endpoint_url, region=lake.region,
                               engine="pyarrow", refresh_s=0.0))
    try:
        wait_until(lambda: folded_answer(store) == expected, 120,
                   lambda: f"{folded_answer(store)} to be {expected}", interval=0.5)
        assert store.fold is not None and store.fold.fragment_files >= 1
    finally:
        store.close()
    with_fragments = evagg_query(lake.url, lake.endpoint_url, user_env)
    assert with_fragments == expected

    assert agent.stop(timeout=120) == 0, agent.log()

    # the same question over every raw event: a copy of the lake without its fragments
    raw_url = lake.copy_without_tasks()
    assert evagg_query(raw_url, lake.endpoint_url, user_env) == with_fragments
