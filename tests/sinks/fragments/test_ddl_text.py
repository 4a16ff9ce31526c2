"""The text of `evagg query ddl` for the engines that cannot run here (Trino, Athena), and
what every dialect must hold: every event column, every fragment column, the fragments'
location, Trino's functions (element_at, never a map subscript, which fails on a missing
key; max_by, not DuckDB's arg_max), and the command line's answers to bad input."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sinks.fragments.ddl import fragment_schema, script, statements
from sinks.schema import EVENT_SCHEMA
from tests.agentproc import REPO
from tests.dashboard.httpfs import needs_httpfs

LAKE = "s3://bucket/evagg/"


def table_of(dialect: str, name: str) -> str:
    found = [s for s in statements(dialect, LAKE)
             if re.search(rf"(TABLE|VIEW)( IF NOT EXISTS)? \S*\b{name} ", s)]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("dialect", ["spark", "trino", "athena", "duckdb"])
def test_every_column_and_the_fragments_location(dialect: str) -> None:
    text = script(dialect, LAKE)
    if dialect != "duckdb":  # DuckDB reads the files' own schema
        events = table_of(dialect, "events_raw")
        for field in EVENT_SCHEMA:
            assert re.search(rf"[`\"]{field.name}[`\"] ", events), field.name
        fragments = table_of(dialect, "task_fragments")
        for name in fragment_schema().names:
            assert re.search(rf"[`\"]{name}[`\"] ", fragments), name
    where = {"spark": "s3a://bucket/evagg/_tasks'", "athena": "'s3://bucket/evagg/_tasks/'",
             "trino": "'s3://bucket/evagg/_tasks'", "duckdb": "'s3://bucket/evagg/_tasks/"}
    assert where[dialect] in text
    assert text.count(";\n") == len(statements(dialect, LAKE))


@pytest.mark.parametrize("dialect", ["trino", "athena"])
def test_trino_sql(dialect: str) -> None:
    text = script(dialect, LAKE)
    assert "element_at(attrs, 'ray_session')" in text
    assert not re.search(r"attrs\[", text)  # a subscript fails on a missing key
    assert "max_by(" in text and "min_by(" in text and "arg_max" not in text
    assert "unix_micros" not in text and "epoch_us" not in text and "QUALIFY" not in text
    assert "CAST(ROW(" in text
    if dialect == "trino":
        assert "CREATE TABLE IF NOT EXISTS hive.evagg.events_raw (" in text
        assert "partitioned_by = ARRAY['date', 'hour', 'node']" in text
        assert "external_location = 's3://bucket/evagg'" in text
        assert text.count("CALL hive.system.sync_partition_metadata(") == 2
        assert "CREATE OR REPLACE VIEW hive.evagg.tasks AS" in text
        assert '"hour" integer' in text and '"time" timestamp' in text
    else:
        assert "CREATE EXTERNAL TABLE IF NOT EXISTS evagg.events_raw (" in text
        assert "PARTITIONED BY (`date` date, `hour` int, `node` string)" in text
        assert "STORED AS PARQUET\nLOCATION 's3://bucket/evagg/'" in text
        assert text.count("MSCK REPAIR TABLE evagg.") == 2
        assert "`metrics` map<string, double>" in text
        assert "`error` struct<error_type:string,exception_class:string," in text
        assert "CREATE OR REPLACE VIEW evagg.tasks AS" in text


def test_a_lake_without_fragments_gets_an_empty_view(tmp_path: Path) -> None:
    (tmp_path / "date=2026-01-01").mkdir()
    text = evagg("query", "ddl", "--dialect", "spark", str(tmp_path)).stdout
    assert "had no _tasks/" in text and "_tasks'" not in text
    assert "WHERE 1 = 0" in text
    (tmp_path / "_tasks" / "date=2026-01-01").mkdir(parents=True)
    (tmp_path / "_tasks" / "date=2026-01-01" / "compacted-x.pq").write_bytes(b"")
    text = evagg("query", "--data", str(tmp_path), "ddl", "--dialect", "spark").stdout
    assert f"file://{tmp_path}/_tasks'" in text


def test_an_s3_lake_s_fragments_are_looked_up_at_the_endpoint_given_after_ddl() -> None:
    # --endpoint-url after the query's name, as every other query takes it
    import os

    from tests.sinks.moto_server import MotoS3, aws_env

    moto = MotoS3().start()
    try:
        bucket = moto.create_bucket()
        lake = f"s3://{bucket}/evagg"
        env = {**os.environ, **aws_env()}
        done = subprocess.run([sys.executable, "-m", "aggregator", "query", "ddl", "--dialect",
                               "duckdb", lake, "--endpoint-url", moto.endpoint_url], cwd=REPO,
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert "had no _tasks/" in done.stdout, done.stdout  # looked, and found none
        moto.client().put_object(Bucket=bucket, Key="evagg/_tasks/date=2026-01-01/hour=0/"
                                 "node=n/compacted-x.pq", Body=b"")
        done = subprocess.run([sys.executable, "-m", "aggregator", "query", "ddl", "--dialect",
                               "duckdb", lake, "--endpoint-url", moto.endpoint_url], cwd=REPO,
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0 and "had no _tasks/" not in done.stdout, done.stderr
    finally:
        moto.stop()


def test_bad_input_is_one_line_and_exit_2() -> None:
    done = evagg("query", "ddl", "--dialect", "trino", "http://example.com/lake", check=False)
    assert done.returncode == 2
    assert done.stderr == ("evagg query ddl: 'http://example.com/lake' is neither a directory "
                           "nor an s3:// prefix\n")
    done = evagg("query", "ddl", "--dialect", "trino", "--schema", "a-b", LAKE, check=False)
    assert done.returncode == 2 and "letters, digits and _" in done.stderr
    done = evagg("query", "ddl", LAKE, check=False)
    assert done.returncode == 2 and "--dialect" in done.stderr


def evagg(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 or not check, done.stderr
    return done


def test_a_missing_lake_exits_1_and_trino_over_a_local_path_says_what_it_needs(
        tmp_path: Path) -> None:
    done = evagg("query", "ddl", "--dialect", "duckdb", str(tmp_path / "nope"), check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert "does not exist" in done.stderr and "s3://" in done.stderr
    lake = tmp_path / "lake"
    lake.mkdir()
    done = evagg("query", "ddl", "--dialect", "athena", str(lake))
    assert "athena reads tables on S3" in done.stderr and "CREATE EXTERNAL TABLE" in done.stdout


def test_compact_refuses_fewer_than_two_files_with_exit_2_and_says_why_it_merged_none(
        tmp_path: Path) -> None:
    done = evagg("compact", "--min-files", "1", str(tmp_path), check=False)
    assert done.returncode == 2 and "--min-files: at least 2" in done.stderr
    partition = tmp_path / "date=2026-01-02" / "hour=03" / "node=n1"
    partition.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"event_id": "e1", "kind": "task"}],
                                        schema=EVENT_SCHEMA), partition / "part-a-0.parquet")
    done = evagg("compact", "--grace", "0", str(tmp_path))
    assert "1 partition with too few files to merge (--min-files)" in done.stdout


@needs_httpfs
def test_duckdb_statements_for_an_s3_compatible_store_run_with_the_secret_they_name(
        tmp_path: Path) -> None:
    """`evagg query ddl --dialect duckdb s3://... --endpoint-url URL`: the header's
    CREATE SECRET, keys filled in as a user would, reads the lake in a plain DuckDB."""
    import os

    import duckdb

    from tests.sinks.moto_server import (
        ACCESS_KEY,
        REGION,
        SECRET_KEY,
        MotoS3,
        aws_env,
        httpfs_extension,
    )

    moto = MotoS3().start()
    try:
        bucket = moto.create_bucket()
        one = tmp_path / "one.parquet"
        pq.write_table(pa.Table.from_pylist(
            [{"event_id": "e1", "kind": "task", "name": "fit", "time": 10**18,
              "received": 10**18}], schema=EVENT_SCHEMA), one)
        moto.client().upload_file(str(one), bucket,
                                  "evagg/date=2026-01-01/hour=00/node=n/part-x.parquet")
        done = subprocess.run([sys.executable, "-m", "aggregator", "query", "ddl", "--dialect",
                               "duckdb", f"s3://{bucket}/evagg", "--endpoint-url",
                               moto.endpoint_url], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, **aws_env()})
        assert done.returncode == 0, done.stderr
        header = " ".join(line.removeprefix("--").strip() for line in done.stdout.splitlines()
                          if line.startswith("--"))
        secret = re.search(r"CREATE SECRET \(.*?\)", header)
        assert secret, header
        assert "URL_STYLE 'path'" in secret.group(0) and "USE_SSL false" in secret.group(0)
        con = duckdb.connect()
        con.execute(f"LOAD '{httpfs_extension()}'")
        con.execute(secret.group(0).replace("KEY_ID '...'", f"KEY_ID '{ACCESS_KEY}'")
                    .replace("SECRET '...'", f"SECRET '{SECRET_KEY}'")
                    .replace("REGION '...'", f"REGION '{REGION}'"))
        con.execute(done.stdout)
        assert con.execute("SELECT event_id, name FROM events").fetchall() == [("e1", "fit")]
    finally:
        moto.stop()


def test_the_printed_secret_names_the_endpoint_without_its_credentials() -> None:
    """The statements are pasted into notebooks and tickets: a key in the endpoint URL
    must not be printed with them. An endpoint without its scheme is refused, not turned
    into ENDPOINT ''."""
    from sinks.fragments.ddl import script

    text = script("duckdb", "s3://b/evagg", endpoint_url="http://key:secret@minio.internal:9000")
    assert "secret@" not in text and "key:" not in text
    assert "on the store at http://minio.internal:9000, first" in text
    assert "ENDPOINT 'minio.internal:9000', URL_STYLE 'path', USE_SSL false" in text
    done = subprocess.run([sys.executable, "-m", "aggregator", "query", "ddl", "--dialect",
                           "duckdb", "s3://b/evagg", "--endpoint-url", "minio:9000"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert ("evagg query ddl: the endpoint URL 'minio:9000' needs its scheme and host, e.g. "
            "http://minio.internal:9000") in done.stderr
