"""Build the configured sinks. The one place that knows every sink type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aggregator.config import SinkConfig
from aggregator.units import parse_duration, parse_size
from sinks.base import Sink
from sinks.filters import EventFilter


def build_sink(config: SinkConfig, *, node_id: str, spool_id: str, state_dir: Path) -> Sink:
    """Raises ValueError with a readable reason when the options don't make a sink."""
    event_filter = EventFilter.of(config.kinds, config.sources, config.names)
    options = dict(config.options)
    if config.type == "parquet":
        return _parquet(config, options, event_filter, node_id, spool_id, state_dir)
    return _http(config, options, event_filter, spool_id, state_dir)


def _parquet(config: SinkConfig, options: dict[str, Any], event_filter: EventFilter,
             node_id: str, spool_id: str, state_dir: Path) -> Sink:
    from sinks.parquet import ParquetSink
    from sinks.stores import LocalStore, ObjectStore

    store: ObjectStore
    if config.url.startswith("s3://"):
        from sinks.s3 import S3Store

        store = S3Store(
            config.url,
            staging_dir=state_dir / "staging" / config.name,
            endpoint_url=options.get("endpoint_url"),
            region=options.get("region"),
            path_style=bool(options.get("path_style", False)),
            multipart_threshold=parse_size(options.get("multipart_threshold", "64MiB")),
        )
    else:
        store = LocalStore(Path(config.url).expanduser())
    return ParquetSink(
        config.name,
        store,
        node_id=node_id,
        spool_id=spool_id,
        roll_max_bytes=parse_size(options.get("roll_max_bytes", "64MiB")),
        roll_interval_s=parse_duration(options.get("roll_interval", "5m")),
        row_group_rows=int(options.get("row_group_rows", 10_000)),
        event_filter=event_filter,
    )


def _http(config: SinkConfig, options: dict[str, Any], event_filter: EventFilter,
          spool_id: str, state_dir: Path) -> Sink:
    from sinks.deadletter import dead_letter_dir
    from sinks.http import HttpSink

    headers = options.get("headers", {})
    if not isinstance(headers, dict):
        raise ValueError("headers: must be a table of name = value")
    body_format = options.get("format", "ndjson")
    if body_format not in ("ndjson", "json"):
        raise ValueError(f"format: {body_format!r} is not one of ndjson, json")
    return HttpSink(
        config.name,
        config.url,
        spool_id=spool_id,
        batch_max_events=int(options.get("batch_max_events", 1000)),
        batch_max_bytes=parse_size(options.get("batch_max_bytes", "4MiB")),
        batch_interval_s=parse_duration(options.get("batch_interval", "1s")),
        body_format=body_format,
        gzip=bool(options.get("gzip", False)),
        gzip_level=int(options.get("gzip_level", 1)),
        headers={str(k): str(v) for k, v in headers.items()},
        timeout_s=parse_duration(options.get("timeout", "10s")),
        max_in_flight=int(options.get("max_in_flight", 4)),
        event_filter=event_filter,
        dead_letter_dir=dead_letter_dir(state_dir, config.name),
    )
