"""Server-side encryption and storage class of the S3 sink's uploads and of `evagg
compact`'s merged files, against a real moto server, which keeps what each upload asked
for. (A compliance
bucket's policy refuses uploads that do not ask for it; moto's policy check ignores the
condition, so the tests read the encryption back from each object instead.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aggregator.config.sinks import SinkConfig
from aggregator.delivery.build import SinkOptionError, build_sink
from sinks.parquet.s3_uploads import encryption_args, upload_args
from sinks.schema import EVENT_SCHEMA
from tests.agentproc import REPO
from tests.sinks.moto_server import MotoS3, aws_env
from tests.sinks.parquet.moto_store import KEY, MIB, make_store, publish, stage_events

KMS_KEY = "arn:aws:kms:us-east-1:123456789012:key/evagg-test"
KMS = encryption_args("aws:kms", KMS_KEY)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture
def bucket(moto: MotoS3, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)
    return moto.create_bucket()


def encryption_of(moto: MotoS3, bucket: str, key: str) -> tuple[str | None, str | None]:
    head = moto.client().head_object(Bucket=bucket, Key=key)
    return head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")


def test_each_upload_asks_for_the_sinks_encryption_and_none_without_it(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    plain = make_store(moto, bucket, tmp_path)
    publish(plain, stage_events(plain, KEY, 100))
    assert encryption_of(moto, bucket, f"lake/{KEY}") == (None, None)
    encrypted = make_store(moto, bucket, tmp_path, upload_args=KMS)
    publish(encrypted, stage_events(encrypted, KEY, 100))
    assert encryption_of(moto, bucket, f"lake/{KEY}") == ("aws:kms", KMS_KEY)


def test_a_multipart_upload_asks_for_the_same_encryption(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path, multipart_threshold=1024,
                       upload_args=encryption_args("AES256", None))
    publish(store, stage_events(store, KEY, 12, padding=MIB))
    assert store.stats["multipart"] == 1
    assert encryption_of(moto, bucket, f"lake/{KEY}") == ("AES256", None)


def _two_small_files(moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    store = make_store(moto, bucket, tmp_path, upload_args=KMS)
    partition = KEY.rpartition("/")[0]
    for first in (1, 101):
        key = f"{partition}/part-spoolA-{first:020d}.parquet"
        rows = [{"event_id": f"e{first + i:08d}", "kind": "task"} for i in range(100)]
        staged = store.staging_path(key)
        pq.write_table(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA), staged)
        publish(store, staged, key)


def _evagg_compact(*args: str, keep_config: bool = False) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **aws_env(), "PYTHONPATH": str(REPO)}
    if not keep_config:
        environment.pop("EVAGG_CONFIG", None)
    environment.pop("EVAGG_DATA", None)
    return subprocess.run([sys.executable, "-m", "aggregator", "compact", *args],
                          capture_output=True, text=True, timeout=120, env=environment)


def test_compact_writes_its_merged_files_as_asked(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    _two_small_files(moto, bucket, tmp_path)
    done = _evagg_compact(f"s3://{bucket}/lake/", "--endpoint-url", moto.endpoint_url,
                          "--grace", "0", "--sse", "aws:kms", "--sse-kms-key-id", KMS_KEY,
                          "--storage-class", "STANDARD_IA")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "botocore" not in done.stderr, done.stderr  # its INFO lines say nothing to act on
    assert_merged_as_asked(moto, bucket)


def test_compact_of_the_agents_config_uploads_as_its_hour_merge_does(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    """An operator runs `evagg compact --config /etc/evagg/evagg.toml`: the lake, its
    endpoint and the sink's encryption and storage class all come from the config, so a
    compliance bucket gets no unencrypted merged file."""
    _two_small_files(moto, bucket, tmp_path)
    config = _encrypting_config(moto, bucket, tmp_path)
    done = _evagg_compact("--config", str(config), "--grace", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"s3://{bucket}/lake/" in done.stdout
    assert_merged_as_asked(moto, bucket)


def test_an_upload_flag_replaces_every_upload_option_of_the_config(
        moto: MotoS3, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--sse AES256` over a config that asks for KMS: the flags are taken as a whole,
    not mixed with the config's KMS key (which would be refused as a flag never given)."""
    _two_small_files(moto, bucket, tmp_path)
    monkeypatch.setenv("EVAGG_CONFIG", str(_encrypting_config(moto, bucket, tmp_path)))
    done = _evagg_compact("--grace", "0", "--sse", "AES256", keep_config=True)
    assert done.returncode == 0, done.stdout + done.stderr
    merged = [k for k in moto.keys(bucket) if "/compacted-" in k]
    assert merged and all(encryption_of(moto, bucket, k) == ("AES256", None)
                          and storage_of(moto, bucket, k) == "STANDARD" for k in merged)


def test_a_target_and_the_agents_config_together_are_refused(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    """Which one names the lake, and whether the config's encryption applies to it, would
    be a guess: a merge of a compliance bucket must not go out unencrypted by it."""
    config = _encrypting_config(moto, bucket, tmp_path)
    done = _evagg_compact(f"s3://{bucket}/other/", "--config", str(config))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("evagg compact: give the lake once: --config names its "
                                  "Parquet sink's lake and upload options"), done.stderr


def test_a_config_of_two_lakes_and_the_one_named_merge_as_its_sink_asks(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    """An agent writing two lakes: `--config` alone is refused with "give --data with the
    one to read"; given so, the merge (and `evagg query`) take that sink's endpoint and
    upload options, as the agent's own hour merge does."""
    _two_small_files(moto, bucket, tmp_path)
    config = _encrypting_config(moto, bucket, tmp_path)
    with config.open("a") as text:
        text.write(f'\n[[sinks]]\nname = "local"\ntype = "parquet"\nurl = "{tmp_path}/b"\n')
    alone = _evagg_compact("--config", str(config), "--grace", "0")
    assert alone.returncode == 2 and "give --data with the one to read" in alone.stderr
    done = _evagg_compact("--config", str(config), "--data", f"s3://{bucket}/lake",
                          "--grace", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert_merged_as_asked(moto, bucket)
    environment = {**os.environ, **aws_env(), "PYTHONPATH": str(REPO)}
    for name in ("EVAGG_CONFIG", "EVAGG_DATA", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        environment.pop(name, None)
    query = subprocess.run([sys.executable, "-m", "aggregator", "query", "--config",
                            str(config), "--data", f"s3://{bucket}/lake/", "--cache",
                            str(tmp_path / "cache"), "sql", "SELECT count(*) AS n FROM events"],
                           capture_output=True, text=True, timeout=120, env=environment)
    assert query.returncode == 0, query.stderr
    assert query.stdout.split()[2] == "200", query.stdout


def _encrypting_config(moto: MotoS3, bucket: str, tmp_path: Path) -> Path:
    config = tmp_path / "evagg.toml"
    config.write_text(f"""[[sinks]]
name = "lake"
type = "parquet"
url = "s3://{bucket}/lake/"
endpoint_url = "{moto.endpoint_url}"
sse = "aws:kms"
sse_kms_key_id = "{KMS_KEY}"
storage_class = "STANDARD_IA"
""")
    return config


def assert_merged_as_asked(moto: MotoS3, bucket: str) -> None:
    merged = [k for k in moto.keys(bucket) if "/compacted-" in k]
    # the merged file and its task fragment (lake/_tasks/...), both uploaded as asked
    assert len(merged) == 2 and sum(k.startswith("lake/_tasks/") for k in merged) == 1
    for key in merged:
        assert encryption_of(moto, bucket, key) == ("aws:kms", KMS_KEY)
        assert storage_of(moto, bucket, key) == "STANDARD_IA"


@pytest.mark.parametrize(("options", "message"), [
    ({"sse": "aes256"}, "sse: 'aes256' is not one of AES256, aws:kms, aws:kms:dsse"),
    ({"sse_kms_key_id": KMS_KEY}, 'sse_kms_key_id: needs sse = "aws:kms"'),
    ({"sse": "AES256", "sse_kms_key_id": KMS_KEY}, "sse_kms_key_id: needs"),
    ({"sse": 1}, "sse: 1 is not a string"),
])
def test_bad_encryption_options_name_their_key(options: dict[str, object], message: str,
                                               tmp_path: Path) -> None:
    config = SinkConfig("lake", "parquet", "s3://bucket/lake/", options=options)
    with pytest.raises(SinkOptionError, match=message.replace("(", r"\(")):
        build_sink(config, node_id="n1", spool_id="s", state_dir=tmp_path)


def test_encryption_options_on_a_local_directory_are_refused(tmp_path: Path) -> None:
    config = SinkConfig("lake", "parquet", str(tmp_path / "lake"), options={"sse": "AES256"})
    with pytest.raises(SinkOptionError, match="sse: applies to s3:// urls only"):
        build_sink(config, node_id="n1", spool_id="s", state_dir=tmp_path)


def test_an_empty_kms_key_id_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match="sse_kms_key_id: is empty"):
        encryption_args("aws:kms", " ")


@pytest.mark.parametrize(("flags", "message"), [
    (["--sse", "AES256"], "apply to s3:// targets only"),
    (["--sse", "aes"], "--sse: 'aes' is not one of"),
    (["--sse-kms-key-id", KMS_KEY], '--sse-kms-key-id: needs sse = "aws:kms"'),
    (["--storage-class", "GLACIER"], "--storage-class: GLACIER objects must be restored"),
])
def test_compact_refuses_encryption_flags_it_cannot_honour(flags: list[str], message: str,
                                                          tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "aggregator", "compact", str(tmp_path), *flags],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and message in done.stderr


def storage_of(moto: MotoS3, bucket: str, key: str) -> str:
    return str(moto.client().head_object(Bucket=bucket, Key=key).get("StorageClass",
                                                                     "STANDARD"))


def test_the_storage_class_is_asked_for_on_both_upload_paths(
        moto: MotoS3, bucket: str, tmp_path: Path) -> None:
    small = make_store(moto, bucket, tmp_path, upload_args=upload_args(
        storage_class="INTELLIGENT_TIERING"))
    publish(small, stage_events(small, KEY, 100))
    assert storage_of(moto, bucket, f"lake/{KEY}") == "INTELLIGENT_TIERING"
    large = make_store(moto, bucket, tmp_path, multipart_threshold=1024, upload_args=upload_args(
        "AES256", storage_class="STANDARD_IA"))
    publish(large, stage_events(large, KEY, 12, padding=MIB))
    assert storage_of(moto, bucket, f"lake/{KEY}") == "STANDARD_IA"
    assert encryption_of(moto, bucket, f"lake/{KEY}") == ("AES256", None)


@pytest.mark.parametrize(("storage_class", "message"), [
    ("GLACIER", "storage_class: GLACIER objects must be restored before DuckDB can read"),
    ("DEEP_ARCHIVE", "must be restored"),
    ("standard_ia", "storage_class: 'standard_ia' is not one of STANDARD"),
])
def test_a_storage_class_the_lake_cannot_be_read_from_is_refused(
        storage_class: str, message: str, tmp_path: Path) -> None:
    config = SinkConfig("lake", "parquet", "s3://bucket/lake/",
                        options={"storage_class": storage_class})
    with pytest.raises(SinkOptionError, match=message):
        build_sink(config, node_id="n1", spool_id="s", state_dir=tmp_path)

