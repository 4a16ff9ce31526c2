"""The S3 store on moto's server for the S3 sink's tests: a store with chosen options, an
event file staged where it publishes from, and a publish run to its end."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.parquet.options import S3Options
from sinks.parquet.s3 import S3Store
from sinks.schema import EVENT_SCHEMA
from tests.sinks.moto_server import MotoS3

MIB = 1024 * 1024
KEY = "date=2026-01-02/hour=03/node=n1/part-spoolA-00000000000000000001.parquet"


def make_store(moto: MotoS3, bucket: str, tmp_path: Path, **options: Any) -> S3Store:
    """A store on moto's `bucket` with these S3Options fields."""
    s3 = S3Options(**{"endpoint_url": moto.endpoint_url, "region": "us-east-1",
                      "path_style": True, **options})
    return S3Store(f"s3://{bucket}/lake/", s3, staging_dir=tmp_path / "staging")


def stage_events(store: S3Store, key: str, count: int, *, padding: int = 0) -> Path:
    """An EVENT_SCHEMA Parquet file of `count` rows at the store's staging path."""
    rows = [{"event_id": f"e{i:08d}", "kind": "task",
             "stack_trace": os.urandom(padding // 2).hex() if padding else None}
            for i in range(count)]
    path = store.staging_path(key)
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA), path,
                   compression="none" if padding else "zstd")
    return path


def publish(store: S3Store, staged: Path, key: str = KEY) -> None:
    asyncio.run(store.publish(staged, key))
