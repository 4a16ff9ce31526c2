"""Shipped files in a lake on S3 (moto's server): a real agent ships a finished file of its
`[[files]]` directory; `evagg query artifact` and the dashboard's download link give the
same bytes back from S3, and the run's index lists it (docs/dashboard.md, "Files")."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO, AgentProcess
from tests.dashboard.serve import serving
from tests.sinks.moto_server import MotoS3, aws_env
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


def evagg_s3(moto: MotoS3, data: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", "query", *args, "--data", data,
                           "--endpoint-url", moto.endpoint_url, "--engine", "pyarrow",
                           "--no-cache"], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**aws_env(), "PATH": "/usr/bin:/bin"})


def get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_a_file_shipped_to_s3_comes_back_through_the_cli_and_the_dashboard(
        agent_factory: Callable[..., AgentProcess], moto: MotoS3, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    bucket = moto.create_bucket(f"art-{uuid.uuid4().hex[:8]}")
    data = f"s3://{bucket}/lake/"
    dumps = tmp_path / "fr"
    (dumps / "run-7").mkdir(parents=True)
    sinks = ('[[sinks]]\nname = "s3lake"\ntype = "parquet"\n'
             f'url = "{data}"\nendpoint_url = "{moto.endpoint_url}"\n'
             'path_style = true\nroll_interval = "1s"\n')
    files = (f'[[files]]\npath = "{dumps}"\nkind = "nccl_flight_recorder"\nsettle = "1s"\n')
    agent = agent_factory(sinks_toml=sinks, env=aws_env(), extra_toml=files).start()
    dump = dumps / "run-7" / "nccl_trace_rank_0"
    body = bytes(range(256)) * 4096  # 1 MiB, every byte value
    dump.write_bytes(body)

    def listed() -> list[dict[str, Any]]:
        done = evagg_s3(moto, data, "artifacts", "--json", "--run", "run-7")
        return list(json.loads(done.stdout)) if done.returncode == 0 else []

    [row] = wait_for(listed, 120, lambda: f"the dump on S3\n{agent.log()}", interval=1.0)
    assert agent.stop() == 0
    assert row["lake_key"] in [k.removeprefix("lake/") for k in moto.keys(bucket, "lake/")]
    assert row["sha256"] == hashlib.sha256(body).hexdigest()
    out = tmp_path / "back"
    done = evagg_s3(moto, data, "artifact", "nccl_trace_rank_0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == body

    store = Store(StoreOptions(data, endpoint_url=moto.endpoint_url, engine="pyarrow"))
    try:
        with serving(store) as url:
            status, index, _ = get(f"{url}/api/artifacts?run=run-7")
            assert status == 200
            [shown] = json.loads(index)["rows"]
            assert (shown["name"], shown["version"]) == ("run-7/nccl_trace_rank_0", 1)
            status, got, headers = get(f"{url}/api/artifact?name=run-7%2Fnccl_trace_rank_0")
            assert status == 200 and got == body
            assert headers["Content-Disposition"].endswith("nccl_trace_rank_0")
            status, missing, _ = get(f"{url}/api/artifact?name=nope")
            assert status == 404 and "no artifact named 'nope'" in json.loads(missing)["error"]
    finally:
        store.close()
