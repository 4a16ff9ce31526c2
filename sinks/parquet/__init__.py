"""The Parquet sink: files in a local directory or on S3, and their compaction."""

from sinks.parquet.sink import ParquetSink

__all__ = ["ParquetSink"]
