"""The `parquet` sink type: files in a local directory or under s3://bucket/prefix/, with
the agent's own hour merges when `compact` is on."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sinks.base import Sink
from sinks.locations import S3Location, is_s3_url
from sinks.parquet.hour_compaction import HourCompaction
from sinks.parquet.options import ParquetOptions
from sinks.parquet.sink import ParquetSink
from sinks.parquet.stores import LocalStore, ObjectStore
from sinks.sink_type import SinkPlace, SinkType


def _build(name: str, url: str, table: Mapping[str, Any], place: SinkPlace) -> Sink:
    options = ParquetOptions.from_table(table, url)
    staging = place.state_dir / "staging" / name  # files before upload, hour merges' too
    store: ObjectStore
    if is_s3_url(url):
        from sinks.parquet.s3 import S3Store  # boto3 loads only for a sink on S3

        store = S3Store(url, options.s3, staging_dir=staging)
    else:
        store = LocalStore(Path(url).expanduser())
    compaction = None
    if options.compact:
        compaction = HourCompaction(url, place.node_id, s3=options.s3,
                                    after_s=options.compact_after_s, scratch_dir=staging)
        compaction.look_back()  # the hours written before this start
    return ParquetSink(name, store, options, node_id=place.node_id, spool_id=place.spool_id,
                       event_filter=place.event_filter, compaction=compaction)


def _url_problem(url: str) -> str | None:
    if is_s3_url(url):
        try:
            S3Location.parse(url)
        except ValueError:
            return "an s3 url needs a bucket (s3://bucket/prefix/)"
        return None
    if "://" in url:
        return "a parquet sink takes a local directory or s3://bucket/prefix/"
    return None


PARQUET = SinkType("parquet", ParquetOptions, _url_problem, _build, one_sink_per_url=True)
