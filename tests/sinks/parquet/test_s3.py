"""S3Store against a real moto server on loopback, read back with DuckDB over s3://."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError

from sinks.base import SinkResult
from sinks.parquet import ParquetSink
from sinks.parquet.options import ParquetOptions, S3Options
from sinks.parquet.s3 import S3Store, StoreError
from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_to_bytes
from tests.sinks.moto_server import MotoS3, aws_env
from tests.sinks.parquet.moto_store import KEY, MIB, make_store, publish, stage_events


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch, moto: MotoS3) -> None:
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)
    if not moto.running:  # a test that simulated an outage failed before restarting
        moto.start()


@pytest.fixture
def bucket(moto: MotoS3) -> str:
    return moto.create_bucket()


def publish_error(store: S3Store, staged: Path, key: str = KEY) -> StoreError:
    with pytest.raises(StoreError) as caught:
        publish(store, staged, key)
    return caught.value


def count_rows(moto: MotoS3, url: str) -> tuple[int, int]:
    (rows, distinct), = moto.duckdb().execute(
        f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet('{url}')").fetchall()
    return rows, distinct


def test_small_file_is_one_put_readable_by_duckdb(moto: MotoS3, bucket: str,
                                                  tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path)
    staged = stage_events(store, KEY, 500)
    publish(store, staged)
    assert moto.keys(bucket) == [f"lake/{KEY}"]
    assert not staged.exists()
    assert store.stats["puts"] == 1 and store.stats["multipart"] == 0
    assert count_rows(moto, f"s3://{bucket}/lake/**/*.parquet") == (500, 500)


def test_large_file_goes_up_in_parts(moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path, multipart_threshold=1024)
    staged = stage_events(store, KEY, 20, padding=MIB)  # about 20 MiB: 3 parts of 8 MiB
    size = staged.stat().st_size
    publish(store, staged)
    head = moto.client().head_object(Bucket=bucket, Key=f"lake/{KEY}", PartNumber=1)
    assert head["PartsCount"] == -(-size // (8 * MIB))
    assert store.stats["multipart"] == 1 and moto.open_uploads(bucket) == []
    assert count_rows(moto, f"s3://{bucket}/lake/{KEY}") == (20, 20)


def fail_part(store: S3Store, number: int, action: Any) -> None:
    """Run `action` when the client is about to send part `number`."""

    def before_part(params: dict[str, Any], **_: Any) -> None:
        if params.get("PartNumber") == number:
            action()

    store.client.meta.events.register("before-parameter-build.s3.UploadPart", before_part)


def test_failed_part_aborts_the_upload(moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path, multipart_threshold=1024)
    staged = stage_events(store, KEY, 20, padding=MIB)

    def cut() -> None:
        raise ConnectionClosedError(endpoint_url=moto.endpoint_url)

    fail_part(store, 2, cut)
    error = publish_error(store, staged)
    assert (error.kind, error.permanent) == ("s3_connect", False)
    assert store.stats["aborted"] == 1
    assert moto.open_uploads(bucket) == [] and moto.keys(bucket) == []
    assert staged.exists()  # the sink deletes it (or retries from the spool)


def test_abort_during_an_outage_is_retried_before_the_next_upload(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path, multipart_threshold=1024)
    fail_part(store, 2, moto.stop)  # the endpoint goes away mid-upload
    error = publish_error(store, stage_events(store, KEY, 20, padding=MIB))
    assert (error.kind, error.permanent) == ("s3_connect", False)
    assert store.stats["abort_failed"] == 1
    moto.start()
    assert len(moto.open_uploads(bucket)) == 1  # nothing could abort it while down
    other = KEY.replace("0001.parquet", "0099.parquet")
    publish(store, stage_events(store, other, 10), other)
    assert moto.open_uploads(bucket) == []
    assert moto.keys(bucket) == [f"lake/{other}"]


def test_missing_bucket_is_permanent(moto: MotoS3, tmp_path: Path) -> None:
    store = make_store(moto, f"missing-{uuid.uuid4().hex[:8]}", tmp_path)
    error = publish_error(store, stage_events(store, KEY, 5))
    assert (error.kind, error.permanent) == ("s3_no_such_bucket", True)
    assert "NoSuchBucket" in str(error) and KEY in str(error)


def test_bad_credentials_are_permanent_and_never_echoed(
        moto: MotoS3, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {"unknown key": ("AKIAEVAGGUNKNOWN0000", "unknown-secret", "s3_bad_credentials"),
             "wrong secret": (None, "wrong-secret-value", "s3_bad_credentials"),
             "no permission": ("denied", None, "s3_access_denied")}
    with moto.enforcing_auth() as users:
        for access_key, secret_key, kind in cases.values():
            user = users["denied"] if access_key == "denied" else users["allowed"]
            access_key = user["access_key"] if access_key in (None, "denied") else access_key
            secret_key = secret_key or user["secret_key"]
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_key)
            store = make_store(moto, bucket, tmp_path)
            error = publish_error(store, stage_events(store, KEY, 5))
            assert (error.kind, error.permanent) == (kind, True)
            assert secret_key not in str(error) and access_key not in str(error)
            assert secret_key not in store.describe()
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", users["allowed"]["access_key"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", users["allowed"]["secret_key"])
        store = make_store(moto, bucket, tmp_path)
        publish(store, stage_events(store, KEY, 5))  # the same bucket with good keys works
    assert moto.keys(bucket) == [f"lake/{KEY}"]


def test_server_down_is_a_transient_connect_error(moto: MotoS3, bucket: str,
                                                 tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path)
    staged = stage_events(store, KEY, 5)
    moto.stop()
    try:
        error = publish_error(store, staged)
    finally:
        moto.start()
    assert (error.kind, error.permanent) == ("s3_connect", False)
    publish(store, staged)  # the same staged file goes up once the endpoint is back
    assert moto.keys(bucket) == [f"lake/{KEY}"]


def answer_with(store: S3Store, status: int, code: str) -> None:
    """Every PutObject gets this error answer (botocore parses it as from S3)."""

    class Raw:
        def stream(self) -> Iterator[bytes]:
            yield f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()

    def before_send(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, status, {}, Raw())

    store.client.meta.events.register("before-send.s3.PutObject", before_send)


@pytest.mark.parametrize(("status", "code", "kind"), [
    (503, "SlowDown", "s3_throttled"),
    (400, "RequestLimitExceeded", "s3_throttled"),
    (500, "InternalError", "s3_5xx"),
    (400, "RequestTimeout", "s3_timeout"),
])
def test_throttling_and_server_errors_are_transient(
        moto: MotoS3, bucket: str, tmp_path: Path, status: int, code: str, kind: str) -> None:
    store = make_store(moto, bucket, tmp_path)
    answer_with(store, status, code)
    error = publish_error(store, stage_events(store, KEY, 5))
    assert (error.kind, error.permanent) == (kind, False)


def test_botocores_retries_and_the_puts_are_counted(moto: MotoS3, bucket: str,
                                                    tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path)
    answer_with(store, 503, "SlowDown")
    publish_error(store, stage_events(store, KEY, 5))  # botocore tried twice, then gave up
    fresh = make_store(moto, bucket, tmp_path)
    publish(fresh, stage_events(fresh, KEY, 5))
    assert {c.name: c.value for c in store.counters()}["s3_retries"] == 1
    assert {c.name: c.value for c in fresh.counters()} == {
        "s3_puts": 1, "s3_multipart_uploads": 0, "s3_aborted_uploads": 0,
        "s3_abort_failures": 0, "s3_swept_uploads": 0, "s3_retries": 0}


def test_same_key_twice_is_one_object_with_the_last_content(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path)
    publish(store, stage_events(store, KEY, 7))
    publish(store, stage_events(store, KEY, 9))
    assert moto.keys(bucket) == [f"lake/{KEY}"]
    assert count_rows(moto, f"s3://{bucket}/lake/**/*.parquet") == (9, 9)


def test_first_upload_sweeps_orphans_of_this_node_only(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    client = moto.client()
    ours = "lake/date=2026-01-01/hour=23/node=n1/part-spoolA-00000000000000000500.parquet"
    theirs = "lake/date=2026-01-01/hour=23/node=n2/part-spoolB-00000000000000000500.parquet"
    for key in (ours, theirs):  # as if a crash had left them mid-upload
        client.create_multipart_upload(Bucket=bucket, Key=key)
    store = make_store(moto, bucket, tmp_path)
    publish(store, stage_events(store, KEY, 3))
    assert [u["Key"] for u in moto.open_uploads(bucket)] == [theirs]
    assert store.stats["swept"] == 1
    # moto reports every upload as initiated in 2010, so the hour rule picks this one
    assert store.abort_stale_multipart_uploads(is_stale=lambda _key, age: age < 3600) == 0
    assert store.abort_stale_multipart_uploads("date=2026-01-01/hour=23/node=n2/") == 1
    assert moto.open_uploads(bucket) == []


def test_staging_paths_cleanup_and_describe(moto: MotoS3, tmp_path: Path) -> None:
    s3 = S3Options(endpoint_url="http://user:hunter2@127.0.0.1:9/", path_style=True,
                   multipart_threshold=MIB)
    store = S3Store("s3://some-bucket/a/b", s3, staging_dir=tmp_path / "st")
    first = store.staging_path(KEY)
    second = store.staging_path(KEY.replace("hour=03", "hour=04"))
    assert first != second and first.parent == second.parent == tmp_path / "st"
    first.write_bytes(b"x")
    second.write_bytes(b"y")
    (tmp_path / "st" / "unrelated.txt").write_bytes(b"z")
    assert store.cleanup_staging() == 2
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["unrelated.txt"]
    assert store.describe() == "s3://some-bucket/a/b/ via http://127.0.0.1:9/"
    assert store.full_key(KEY) == f"a/b/{KEY}"
    with pytest.raises(ValueError):
        S3Store("https://bucket/x", staging_dir=tmp_path)


def test_unreadable_staged_file_is_a_staging_error(moto: MotoS3, bucket: str,
                                                   tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path)
    error = publish_error(store, tmp_path / "gone.parquet")
    assert (error.kind, error.permanent) == ("staging_io", False)


def spool_records(count: int, per_record: int) -> list[SpoolRecord]:
    received = 1_767_322_800_000_000_000  # 2026-01-02 03:00 UTC
    records = []
    for n in range(count):
        rows = [{"event_id": f"r{n:04d}-{i:04d}", "kind": "task", "received": received}
                for i in range(per_record)]
        batch = pa.RecordBatch.from_pylist(rows, schema=EVENT_SCHEMA)
        records.append(SpoolRecord(n + 1, bytes(16), n, received, per_record,
                                   batch_to_bytes(batch)))
    return records


def deliver(sink: ParquetSink, records: list[SpoolRecord]) -> tuple[SinkResult, SinkResult]:
    async def run() -> tuple[SinkResult, SinkResult]:
        try:
            return await sink.write(records), await sink.flush(final=True)
        finally:
            await sink.close()

    return asyncio.run(run())


def test_parquet_sink_delivers_through_s3(moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path, multipart_threshold=1024)
    sink = ParquetSink("lake", store, ParquetOptions(roll_interval_s=60), node_id="n1",
                       spool_id="spoolA")
    written, flushed = deliver(sink, spool_records(20, 100))
    assert written.ok and flushed.ok and flushed.durable_through == 20
    assert flushed.delivered_events == 2000
    assert moto.keys(bucket) == [f"lake/{KEY}"] and moto.open_uploads(bucket) == []
    assert count_rows(moto, f"s3://{bucket}/lake/**/*.parquet") == (2000, 2000)
    assert list((tmp_path / "staging").iterdir()) == []


def test_parquet_sink_reports_the_store_error_class(moto: MotoS3, tmp_path: Path) -> None:
    """The sink's failure carries StoreError's kind and permanence: the delivery loop
    labels evagg_delivery_errors_total with the kind and retries a permanent one slowly."""
    store = make_store(moto, f"missing-{uuid.uuid4().hex[:8]}", tmp_path)
    sink = ParquetSink("lake", store, node_id="n1", spool_id="spoolA")
    _, flushed = deliver(sink, spool_records(2, 10))
    assert not flushed.ok
    assert (flushed.error_kind, flushed.permanent) == ("s3_no_such_bucket", True)
    failures = [c for c in sink.counters() if c.name == "publish_failures"]
    assert [(c.reason, c.value) for c in failures] == [("s3_no_such_bucket", 1)]
    assert list((tmp_path / "staging").iterdir()) == []


def test_an_outage_logs_the_skipped_orphan_sweep_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # every upload during an outage tries the sweep again: the log says it once
    from tests.ports import free_port

    s3 = S3Options(endpoint_url=f"http://127.0.0.1:{free_port()}", path_style=True)
    store = S3Store("s3://down/lake", s3, staging_dir=tmp_path / "st")
    with caplog.at_level("WARNING", logger="evagg"):
        for _ in range(3):
            assert publish_error(store, stage_events(store, KEY, 2)).kind == "s3_connect"
    said = [r.getMessage() for r in caplog.records if "orphan sweep skipped" in r.getMessage()]
    assert len(said) == 1, said
