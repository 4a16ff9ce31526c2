"""Ray's log files into a lake on S3 (moto's server): every byte once through agent
kills, then `evagg query logs` and Ray's own client read the task's lines from S3."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from dashboard.lake.store import Store, StoreOptions
from sinks.raylogs.layout import decompress_piece
from tests.agentproc import REPO, AgentProcess
from tests.aggregator.raylogs.rayevents import SESSION, post, running_event, task_hex
from tests.dashboard.raylogclient import get_logs
from tests.dashboard.serve import serving
from tests.sinks.moto_server import MotoS3, aws_env
from tests.waiting import wait_until

Factory = Callable[..., AgentProcess]


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


def s3_file(client: Any, bucket: str, name: str) -> bytes:
    """A file's first generation read back from S3 as docs/ray-logs.md says: its pieces
    in name order, decompressed and joined; fails on an overlap or a gap."""
    data = b""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="lake/_logs/")
    keys = sorted(item["Key"] for page in pages for item in page.get("Contents", ())
                  if f"/{name}/gen=0000/" in item["Key"])
    for key in keys:
        start, end = (int(part) for part in key.rsplit("/", 1)[1].removesuffix(".zst").split("-"))
        assert start == len(data), f"{key}: starts at {start}, expected {len(data)}"
        body = decompress_piece(client.get_object(Bucket=bucket, Key=key)["Body"].read(),
                                end - start)
        assert len(body) == end - start
        data += body
    return data


def test_every_byte_once_on_s3_and_read_back(agent_factory: Factory, moto: MotoS3,
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    bucket = f"lake-{uuid.uuid4().hex[:8]}"
    client: Any = boto3.client("s3", endpoint_url=moto.endpoint_url)
    client.create_bucket(Bucket=bucket)
    ray_root = tmp_path / "ray"
    logs = ray_root / SESSION / "logs"
    logs.mkdir(parents=True)
    out = logs / f"worker-{7:056x}-01000000-6007.out"
    out.write_text("")
    sinks = ('[[sinks]]\nname = "s3lake"\ntype = "parquet"\n'
             f'url = "s3://{bucket}/lake/"\nendpoint_url = "{moto.endpoint_url}"\n'
             'path_style = true\nroll_interval = "1s"\n')
    agent = agent_factory(sinks_toml=sinks, env=aws_env(),
                          extra_toml=f'[ray]\nlog_dir = "{ray_root}"\n').start()
    task = task_hex(7)
    post(agent.http_url, [running_event(task, str(out), str(out.with_suffix(".err")))])
    stop = threading.Event()

    def write() -> None:
        with out.open("a", buffering=1) as handle:
            n = 0
            while not stop.is_set():
                handle.write(f"s3 line {n} ✓\n")
                n += 1
                if n % 100 == 0:
                    stop.wait(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for kills in range(2):
            wait_until(lambda: agent.metric("evagg_ray_log_pieces_total") > 0, 60,
                       f"pieces on S3 before kill {kills + 1}")
            assert agent.proc is not None
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait()
            agent.proc = None
            agent.start()
    finally:
        stop.set()
        writer.join()
    want = out.read_bytes()
    post(agent.http_url, [running_event(task, str(out), str(out.with_suffix(".err")),
                                        ends=(len(want), 0))])
    wait_until(lambda: s3_file(client, bucket, out.name) == want, 90,
               lambda: f"{len(s3_file(client, bucket, out.name))} of {len(want)} bytes on S3")
    assert agent.stop() == 0
    lines = want.decode().splitlines(keepends=True)

    done = subprocess.run([sys.executable, "-m", "aggregator", "query", "logs", "--data",
                           f"s3://{bucket}/lake/", "--endpoint-url", moto.endpoint_url,
                           "--engine", "pyarrow", "--task", task, "--tail", "5"],
                          capture_output=True, cwd=REPO, timeout=120, check=False,
                          env={**aws_env(), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("---\n\n", 1)[1] == "".join(lines[-5:])

    store = Store(StoreOptions(f"s3://{bucket}/lake/", endpoint_url=moto.endpoint_url,
                               engine="pyarrow"))
    try:
        with serving(store) as url:
            assert get_logs(url, [{"task_id": task}]) == [want.decode()]
    finally:
        store.close()
