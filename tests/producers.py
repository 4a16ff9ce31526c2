"""Producer processes for end-to-end tests (tests/producer.py, run as a module), and what
a test checks of what they delivered: each numbered event in the lake, on a local directory or
on S3, exactly once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tests.agentproc import REPO, query_lake

if TYPE_CHECKING:
    from tests.sinks.moto_server import MotoS3


# The keys the Parquet sink writes under a test lake's `lake/` prefix on S3, for the node
# name tests/agentproc.py gives its agents.
S3_KEY = re.compile(r"^lake/date=\d{4}-\d\d-\d\d/hour=\d\d/node=test-node/"
                    r"part-[A-Za-z0-9_.%-]+-\d{20}\.parquet$")


def start_producer(
    socket_path: Path, prefix: str, count: int, **options: Any
) -> subprocess.Popen[bytes]:
    args = [
        sys.executable,
        "-m",
        "tests.producer",
        "--socket",
        str(socket_path),
        "--prefix",
        prefix,
        "--count",
        str(count),
    ]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}
    )


def producer_report(proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    report: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return report


def assert_exactly_once(lake: Path, expected: dict[str, int]) -> None:
    """Every task_id '<prefix>-<i>' for i < count is in the lake exactly once."""
    rows = query_lake(
        lake, "SELECT task_id, count(*) FROM events WHERE kind = 'task' GROUP BY task_id"
    )
    seen = dict(rows)
    duplicates = {k: v for k, v in seen.items() if v != 1}
    assert not duplicates, f"duplicated: {list(duplicates.items())[:5]}"
    wanted = {f"{prefix}-{i}" for prefix, count in expected.items() for i in range(count)}
    missing = wanted - set(seen)
    assert not missing, f"{len(missing)} missing, e.g. {sorted(missing)[:5]}"
    ((ids, distinct),) = query_lake(lake, "SELECT count(*), count(DISTINCT event_id) FROM events")
    assert ids == distinct


def assert_exactly_once_on_s3(moto: MotoS3, bucket: str, expected: dict[str, int]) -> None:
    """Every task_id '<prefix>-<i>' for i < count is in the bucket exactly once."""
    con = moto.duckdb()
    con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet("
                f"'s3://{bucket}/lake/**/*.parquet', hive_partitioning = true)")
    seen = dict(con.execute("SELECT task_id, count(*) FROM events WHERE kind = 'task' "
                            "GROUP BY task_id").fetchall())
    duplicates = {k: v for k, v in seen.items() if v != 1}
    assert not duplicates, f"duplicated: {list(duplicates.items())[:5]}"
    wanted = {f"{prefix}-{i}" for prefix, count in expected.items() for i in range(count)}
    missing = wanted - set(seen)
    assert not missing, f"{len(missing)} missing, e.g. {sorted(missing)[:5]}"
    (rows, distinct), = con.execute(
        "SELECT count(*), count(DISTINCT event_id) FROM events").fetchall()
    assert rows == distinct
    keys = moto.keys(bucket)
    assert keys and all(S3_KEY.match(key) for key in keys), keys[:5]
    assert moto.open_uploads(bucket) == []
