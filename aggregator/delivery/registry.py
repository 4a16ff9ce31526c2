"""The sink types: for each, the class that reads its options and the builder of a sink.

Every [[sinks]] table goes through its type's `from_table`, whether `evagg run` starts
the sinks, `evagg check-config` checks them or `evagg dlq replay` sends with an HTTP
sink's options, so they refuse the same option with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinks.base import Sink
from sinks.filters import EventFilter
from sinks.http.options import HttpOptions
from sinks.locations import is_s3_url
from sinks.options import SinkOptionError, option, optional_text
from sinks.units import parse_bool, parse_positive_size

if TYPE_CHECKING:
    from aggregator.config.sinks import SinkConfig

__all__ = ["SINK_TYPES", "SinkOptionError", "build_sink", "sink_problem"]


@dataclass(frozen=True)
class _Where:
    """What a builder needs besides the sink's table."""

    node_id: str
    spool_id: str
    state_dir: Path
    event_filter: EventFilter


@dataclass(frozen=True)
class SinkType:
    keys: frozenset[str]  # the type-specific keys of its [[sinks]] table
    build: Callable[[SinkConfig, _Where], Sink]  # raises ValueError naming the problem


def build_sink(config: SinkConfig, *, node_id: str, spool_id: str, state_dir: Path) -> Sink:
    """Raises ValueError (SinkOptionError for one option) when the options don't make a sink."""
    where = _Where(node_id, spool_id, state_dir,
                   EventFilter.of(config.kinds, config.sources, config.names))
    return SINK_TYPES[config.type].build(config, where)


def sink_problem(index: int, config: SinkConfig, exc: Exception) -> str:
    """How a sink that cannot be built is reported, the same by every command."""
    if isinstance(exc, SinkOptionError):
        return f"sinks[{index}] ({config.name}).{exc.key}: {exc.reason}"
    return f"sinks[{index}] ({config.name}): {exc}"


def _http(config: SinkConfig, where: _Where) -> Sink:
    from sinks.http import HttpSink
    from sinks.http.deadletter import dead_letter_dir

    return HttpSink(
        config.name,
        config.url,
        HttpOptions.from_table(config.options),
        spool_id=where.spool_id,
        max_retry_backoff_s=config.retry_max_backoff_s,
        event_filter=where.event_filter,
        dead_letter_dir=dead_letter_dir(where.state_dir, config.name),
    )


def _parquet(config: SinkConfig, where: _Where) -> Sink:
    from sinks.options import at_least
    from sinks.parquet import ParquetSink
    from sinks.parquet.stores import LocalStore, ObjectStore
    from sinks.units import parse_positive_duration

    options = dict(config.options)
    store: ObjectStore
    if is_s3_url(config.url):
        from sinks.parquet.s3 import S3Store

        store = S3Store(
            config.url,
            staging_dir=where.state_dir / "staging" / config.name,
            endpoint_url=option(options, "endpoint_url", None, optional_text),
            region=option(options, "region", None, optional_text),
            path_style=option(options, "path_style", False, parse_bool),
            multipart_threshold=option(options, "multipart_threshold", 64 * 1024 * 1024,
                                       parse_positive_size),
            upload_args=_upload_args(options),
        )
    else:
        for key in ("sse", "sse_kms_key_id", "storage_class"):
            if key in options:
                raise SinkOptionError(key, "applies to s3:// urls only")
        store = LocalStore(Path(config.url).expanduser())
    return ParquetSink(
        config.name,
        store,
        node_id=where.node_id,
        spool_id=where.spool_id,
        roll_max_bytes=option(options, "roll_max_bytes", 64 * 1024 * 1024, parse_positive_size),
        roll_interval_s=option(options, "roll_interval", 300.0, parse_positive_duration),
        row_group_rows=option(options, "row_group_rows", 10_000, at_least(1)),
        event_filter=where.event_filter,
    )


def _upload_args(options: Mapping[str, Any]) -> dict[str, str]:
    from sinks.parquet.s3_uploads import upload_args

    try:
        return upload_args(*(option(options, key, None, optional_text)
                             for key in ("sse", "sse_kms_key_id", "storage_class")))
    except ValueError as exc:  # the message starts with the option's key
        key, _, reason = str(exc).partition(": ")
        raise SinkOptionError(key, reason) from None


_PARQUET_KEYS = frozenset({"roll_max_bytes", "roll_interval", "row_group_rows", "endpoint_url",
                           "region", "path_style", "multipart_threshold", "sse",
                           "sse_kms_key_id", "storage_class"})
SINK_TYPES: Mapping[str, SinkType] = {
    "parquet": SinkType(_PARQUET_KEYS, _parquet),
    "http": SinkType(HttpOptions.KEYS, _http),
}
