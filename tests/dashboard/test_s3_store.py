"""The views over S3 (moto's server on loopback): DuckDB httpfs, the pyarrow fallback,
and clear errors for a missing prefix or bucket."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

import dashboard.lake.s3
from dashboard.cli.query import add_query_parser, run_query
from dashboard.lake.errors import NoData, NotFound
from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO
from tests.commands import evagg
from tests.dashboard.httpfs import NO_HTTPFS, needs_httpfs
from tests.dashboard.lakegen import Expected, task_events, write_rows, write_sample_store
from tests.ports import free_port
from tests.sinks.moto_server import MotoS3, aws_env

BUCKET = "evagg-lake"
PREFIX = "cluster-1/events"
CHECKS = (
    "SELECT * FROM task_summary ORDER BY ALL",
    "SELECT run_id, step, ops, failures, seconds FROM steps ORDER BY ALL",
    "SELECT count(*) FROM events",
    "SELECT node_id, received_per_s, lost_events FROM agents ORDER BY ALL",
)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = MotoS3().start()
    yield server.endpoint_url
    server.stop()


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def s3_lake(endpoint: str) -> type[Expected]:
    client: Any = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    client.create_bucket(Bucket="evagg-empty")

    def put(relative: str, data: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{relative}", Body=data)

    return write_sample_store(put)


@pytest.fixture(scope="module")
def local_answers(tmp_path_factory: pytest.TempPathFactory) -> list[list[list[Any]]]:
    from tests.dashboard.lakegen import local_put

    root = tmp_path_factory.mktemp("local-lake")
    write_sample_store(local_put(root))
    store = Store(StoreOptions(str(root)))
    answers = [store.execute(sql).rows for sql in CHECKS]
    store.close()
    return answers


ENGINES = [pytest.param("httpfs", marks=needs_httpfs), "pyarrow"]


def s3_store(endpoint: str, engine: str, prefix: str = PREFIX, bucket: str = BUCKET) -> Store:
    return Store(StoreOptions(f"s3://{bucket}/{prefix}", endpoint_url=endpoint, engine=engine,
                              refresh_s=0.0))


@pytest.mark.parametrize("engine", ENGINES)
def test_same_answers_as_local(endpoint: str, s3_lake: type[Expected], engine: str,
                               local_answers: list[list[list[Any]]]) -> None:
    store = s3_store(endpoint, engine)
    assert store.engine == engine
    assert [store.execute(sql).rows for sql in CHECKS] == local_answers
    assert store.execute("SELECT count(*) FROM tasks").rows[0][0] == s3_lake.tasks
    assert store.describe()["files"] == 8
    store.close()


@needs_httpfs
def test_auto_uses_httpfs_and_falls_back_to_pyarrow(
        endpoint: str, s3_lake: type[Expected], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    auto = s3_store(endpoint, "auto")
    assert auto.engine == "httpfs" and auto.note == ""
    auto.close()
    monkeypatch.setattr(dashboard.lake.s3, "httpfs_extension_path", lambda: None)
    monkeypatch.setenv("HOME", str(tmp_path))  # no build in DuckDB's extension folder either
    fallback = s3_store(endpoint, "auto")
    assert fallback.engine == "pyarrow"
    assert "httpfs did not load" in fallback.note and "INSTALL httpfs" in fallback.note
    assert fallback.execute("SELECT count(*) FROM events").rows[0][0] == s3_lake.distinct_events
    fallback.close()


@pytest.mark.skipif(not NO_HTTPFS, reason="an httpfs build loads into this DuckDB")
def test_without_httpfs_auto_reads_through_pyarrow_and_says_why(
        endpoint: str, s3_lake: type[Expected]) -> None:
    store = s3_store(endpoint, "auto")
    assert store.engine == "pyarrow" and "reading with pyarrow" in store.note
    assert store.execute("SELECT count(*) FROM tasks").rows[0][0] == s3_lake.tasks
    store.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_new_objects_are_picked_up(endpoint: str, s3_lake: type[Expected], engine: str) -> None:
    client: Any = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    prefix = f"growing-{engine}"
    for key in client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]:
        client.copy_object(Bucket=BUCKET, CopySource={"Bucket": BUCKET, "Key": key["Key"]},
                           Key=key["Key"].replace(PREFIX, prefix))
    store = s3_store(endpoint, engine, prefix=prefix)
    assert store.execute("SELECT count(*) FROM tasks").rows[0][0] == s3_lake.tasks

    def put(relative: str, data: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{relative}", Body=data)

    write_rows(put, task_events("s3new", "late", start=80.0, run_s=1.0, end_state="FINISHED"),
               "part-00020.parquet")
    assert store.execute("SELECT count(*) FROM tasks").rows[0][0] == s3_lake.tasks + 1
    store.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_missing_prefix_and_bucket(endpoint: str, s3_lake: type[Expected], engine: str) -> None:
    store = s3_store(endpoint, engine, prefix="no/such/prefix")
    with pytest.raises(NoData, match=f"no Parquet files under s3://{BUCKET}/no/such/prefix yet"):
        store.execute("SELECT 1")
    empty_bucket = s3_store(endpoint, engine, prefix="", bucket="evagg-empty")
    with pytest.raises(NoData):
        empty_bucket.refresh()
    missing = s3_store(endpoint, engine, bucket="no-such-bucket")
    with pytest.raises(NotFound, match="bucket no-such-bucket does not exist"):
        missing.refresh()


def test_query_cli_over_s3(endpoint: str, s3_lake: type[Expected],
                           capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="evagg")
    add_query_parser(parser.add_subparsers())
    args = parser.parse_args(["query", "--data", f"s3://{BUCKET}/{PREFIX}/", "--endpoint-url",
                              endpoint, "tasks", "--error-type", "ValueError", "--json"])
    assert run_query(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["task_id"] for r in rows) == ["boom1", "boom2"]
    args = parser.parse_args(["query", "--data", f"s3://{BUCKET}/nothing-here",
                              "--endpoint-url", endpoint, "summary"])
    assert run_query(args) == 1
    assert "no Parquet files under" in capsys.readouterr().err
    args = parser.parse_args(["query", "--data", "s3://", "summary"])
    assert run_query(args) == 2
    assert "not an S3 URL" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ENGINES)
def test_rotated_credentials_reach_the_reader(endpoint: str, s3_lake: type[Expected],
                                              engine: str, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    store = s3_store(endpoint, engine)
    before = store.execute("SELECT count(*) FROM tasks").rows
    real = dashboard.lake.s3.S3Settings.resolve

    def rotated(*args: Any, **kwargs: Any) -> dashboard.lake.s3.S3Settings:
        settings = real(*args, **kwargs)
        return dataclasses.replace(settings, access_key="rotated-key", session_token="tok-2")

    monkeypatch.setattr(dashboard.lake.s3.S3Settings, "resolve", staticmethod(rotated))
    store.refresh(force=True)
    assert store.execute("SELECT count(*) FROM tasks").rows == before
    if engine == "httpfs":
        secret = store.execute("SELECT secret_string FROM duckdb_secrets() "
                               "WHERE name = 'evagg_s3'").rows[0][0]
        assert "rotated-key" in secret
    store.close()


def test_query_without_credentials_or_endpoint_says_what_to_do(endpoint: str,
                                                               tmp_path: Path) -> None:
    """`evagg query` over S3 as a user runs it where boto3 finds no credentials, then
    with a wrong --endpoint-url: exit 1, and each error names what to fix."""
    home = tmp_path / "home"
    home.mkdir()
    bare = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    bare.update(HOME=str(home), AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO),
                AWS_REGION="us-east-1")
    lake = f"s3://{BUCKET}/{PREFIX}"
    no_keys = evagg("query", "--data", lake, "--endpoint-url", endpoint, "--no-cache",
                    "sql", "SELECT 1", env=bare)
    assert no_keys.returncode == 1, no_keys.stderr
    assert "Unable to locate credentials" in no_keys.stderr
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in no_keys.stderr

    nobody = f"http://127.0.0.1:{free_port()}"
    wrong = evagg("query", "--data", lake, "--endpoint-url", nobody, "--no-cache",
                  "sql", "SELECT 1", env={**bare, **aws_env()})
    assert wrong.returncode == 1, wrong.stderr
    assert f"cannot list {lake}/" in wrong.stderr
    assert "check --endpoint-url" in wrong.stderr
