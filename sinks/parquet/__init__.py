"""The Parquet sink: files in a local directory or on S3, and their compaction.

`ParquetSink` is loaded on first use: the readers (`evagg query`, the dashboard) import
this package's path layout, and need none of the writer's pyarrow and asyncio."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinks.parquet.sink import ParquetSink

__all__ = ["ParquetSink"]


def __getattr__(name: str) -> Any:
    if name == "ParquetSink":
        from sinks.parquet.sink import ParquetSink

        return ParquetSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
