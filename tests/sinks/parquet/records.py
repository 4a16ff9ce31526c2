"""Spool records for the Parquet sink's tests at fixed receive times, a clock to hand the
sink, and DuckDB over the files it wrote."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from sinks.records import SpoolRecord
from sinks.schema import EVENT_SCHEMA, batch_to_bytes

HOUR_NS = 3600 * 10**9
T10 = 1_714_557_600 * 10**9  # 2024-05-01 10:00:00 UTC
SESSION = bytes(16)


def events(
    offset: int, count: int, received_ns: int, kinds: Sequence[str] = ("task",)
) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{offset:06d}-{i:04d}",
            "time": received_ns - 1000 + i,
            "kind": kinds[i % len(kinds)],
            "source": "test",
            "name": f"step-{i % 7}",
            "attempt": 0,
            "pid": 77,
            "step": i,
            "metrics": {"loss": 1.0 / (i + 1), "lr": 0.001},
            "nonfinite": ["grad"] if i % 5 == 0 else None,
            "attrs": {"zone": "eu", "run": str(offset)},
            "received": received_ns,
        }
        for i in range(count)
    ]


def record(
    offset: int, count: int = 100, received_ns: int = T10, kinds: Sequence[str] = ("task",)
) -> SpoolRecord:
    batch = pa.RecordBatch.from_pylist(
        events(offset, count, received_ns, kinds), schema=EVENT_SCHEMA
    )
    return SpoolRecord(offset, SESSION, offset, received_ns, count, batch_to_bytes(batch))


def records(first: int, last: int, **kwargs: Any) -> list[SpoolRecord]:
    return [record(offset, **kwargs) for offset in range(first, last + 1)]


class Clock:
    """A monotonic clock that moves only when a test sets `now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def duck(root: Path, sql: str) -> list[tuple[Any, ...]]:
    """`sql` over the Parquet under `root`, read as the table EVENTS."""
    source = f"read_parquet('{root}/**/*.parquet', hive_partitioning=true)"
    with duckdb.connect() as con:
        return con.execute(sql.replace("EVENTS", source)).fetchall()
