"""Build the configured sinks. The one place that knows every sink type.

Every option goes through `option()`, so an error names its key ("roll_max_bytes: 'abc'
is not a size") and a wrong type is a ValueError, never a TypeError traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from aggregator.config.sinks import SinkConfig
from sinks.base import Sink
from sinks.filters import EventFilter
from sinks.locations import is_s3_url
from sinks.units import (
    parse_bool,
    parse_int,
    parse_positive_duration,
    parse_positive_size,
)

if TYPE_CHECKING:
    from sinks.http.tls import TlsOptions

T = TypeVar("T")


class SinkOptionError(ValueError):
    """One sink option that cannot be used; `key` is its name in the config."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def option(options: Mapping[str, Any], key: str, default: Any, parse: Callable[[Any], T]) -> T:
    try:
        return parse(options.get(key, default))
    except (ValueError, TypeError) as exc:
        raise SinkOptionError(key, str(exc)) from None


def build_sink(config: SinkConfig, *, node_id: str, spool_id: str, state_dir: Path) -> Sink:
    """Raises ValueError (SinkOptionError for one option) when the options don't make a sink."""
    event_filter = EventFilter.of(config.kinds, config.sources, config.names)
    options = dict(config.options)
    if config.type == "parquet":
        return _parquet(config, options, event_filter, node_id, spool_id, state_dir)
    return _http(config, options, event_filter, spool_id, state_dir)


def _parquet(config: SinkConfig, options: dict[str, Any], event_filter: EventFilter,
             node_id: str, spool_id: str, state_dir: Path) -> Sink:
    from sinks.parquet import ParquetSink
    from sinks.parquet.stores import LocalStore, ObjectStore

    store: ObjectStore
    if is_s3_url(config.url):
        from sinks.parquet.s3 import S3Store

        store = S3Store(
            config.url,
            staging_dir=state_dir / "staging" / config.name,
            endpoint_url=option(options, "endpoint_url", None, _optional_text),
            region=option(options, "region", None, _optional_text),
            path_style=option(options, "path_style", False, parse_bool),
            multipart_threshold=option(options, "multipart_threshold", "64MiB",
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
        node_id=node_id,
        spool_id=spool_id,
        roll_max_bytes=option(options, "roll_max_bytes", "64MiB", parse_positive_size),
        roll_interval_s=option(options, "roll_interval", "5m", parse_positive_duration),
        row_group_rows=option(options, "row_group_rows", 10_000, _at_least(1)),
        event_filter=event_filter,
    )


def _http(config: SinkConfig, options: dict[str, Any], event_filter: EventFilter,
          spool_id: str, state_dir: Path) -> Sink:
    from sinks.http import HttpSink
    from sinks.http.deadletter import dead_letter_dir

    headers = headers_option(options)
    return HttpSink(
        config.name,
        config.url,
        spool_id=spool_id,
        batch_max_events=option(options, "batch_max_events", 1000, _at_least(1)),
        batch_max_bytes=option(options, "batch_max_bytes", "4MiB", parse_positive_size),
        batch_interval_s=option(options, "batch_interval", "1s", parse_positive_duration),
        body_format=option(options, "format", "ndjson", _body_format),
        gzip=option(options, "gzip", False, parse_bool),
        gzip_level=option(options, "gzip_level", 1, _gzip_level),
        headers=headers,
        timeout_s=option(options, "timeout", "10s", parse_positive_duration),
        max_in_flight=option(options, "max_in_flight", 4, _at_least(1)),
        event_filter=event_filter,
        dead_letter_dir=dead_letter_dir(state_dir, config.name),
        tls=tls_options(options),
        proxy=proxy_option(options),
    )


def _upload_args(options: Mapping[str, Any]) -> dict[str, str]:
    from sinks.parquet.s3_uploads import upload_args

    try:
        return upload_args(*(option(options, key, None, _optional_text)
                             for key in ("sse", "sse_kms_key_id", "storage_class")))
    except ValueError as exc:  # the message starts with the option's key
        key, _, reason = str(exc).partition(": ")
        raise SinkOptionError(key, reason) from None


def headers_option(options: Mapping[str, Any]) -> dict[str, str]:
    """An HTTP sink's `headers` table, unresolved (also read by `evagg dlq replay`)."""
    return option(options, "headers", {}, _header_table)


def proxy_option(options: Mapping[str, Any]) -> str:
    """An HTTP sink's `proxy` key (also read by `evagg dlq replay`)."""
    return option(options, "proxy", "env", _text)


def tls_options(options: Mapping[str, Any]) -> TlsOptions:
    """An HTTP sink's `tls_*` keys (also read by `evagg dlq replay`)."""
    from sinks.http.tls import TlsOptions

    return TlsOptions(
        ca_file=option(options, "tls_ca_file", None, _optional_text),
        cert_file=option(options, "tls_cert_file", None, _optional_text),
        key_file=option(options, "tls_key_file", None, _optional_text),
        verify=option(options, "tls_verify", True, parse_bool),
    )


def _at_least(lowest: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        number = parse_int(value)
        if number < lowest:
            raise ValueError(f"{value!r} must be at least {lowest}")
        return number

    return parse


def _gzip_level(value: Any) -> int:
    level = parse_int(value)
    if not -1 <= level <= 9:
        raise ValueError(f"{value!r} is not a zlib level from -1 to 9")
    return level


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (quote it)")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _body_format(value: Any) -> Literal["ndjson", "json"]:
    if value == "ndjson":
        return "ndjson"
    if value == "json":
        return "json"
    raise ValueError(f"{value!r} is not one of ndjson, json")


def _header_table(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("must be a table of name = value")
    return {str(k): str(v) for k, v in value.items()}
