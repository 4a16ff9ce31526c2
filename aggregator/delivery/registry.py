"""The builder of each sink type (whose options class config's `sink_options()` names).

Every [[sinks]] table goes through its type's `from_table`, whether `evagg run` starts
the sinks, `evagg check-config` checks them or `evagg dlq replay` sends with an HTTP
sink's options, so they refuse the same option with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sinks.base import Sink
from sinks.filters import EventFilter
from sinks.http.options import HttpOptions
from sinks.locations import is_s3_url
from sinks.options import SinkOptionError
from sinks.parquet.options import ParquetOptions

if TYPE_CHECKING:
    from aggregator.config.sinks import SinkConfig

__all__ = ["SinkOptionError", "build_sink", "sink_problem"]


@dataclass(frozen=True)
class _Where:
    """What a builder needs besides the sink's config."""

    node_id: str
    spool_id: str
    state_dir: Path
    event_filter: EventFilter


def build_sink(config: SinkConfig, *, node_id: str, spool_id: str, state_dir: Path) -> Sink:
    """Raises ValueError (SinkOptionError for one option) when the options don't make a sink."""
    where = _Where(node_id, spool_id, state_dir,
                   EventFilter.of(config.kinds, config.sources, config.names))
    return _BUILDERS[config.type](config, where)


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
    from sinks.parquet import ParquetSink
    from sinks.parquet.hour_compaction import HourCompaction
    from sinks.parquet.stores import LocalStore, ObjectStore

    options = ParquetOptions.from_table(config.options, config.url)
    store: ObjectStore
    if is_s3_url(config.url):
        from sinks.parquet.s3 import S3Store  # boto3 loads only for a sink on S3

        store = S3Store(config.url, options.s3,
                        staging_dir=where.state_dir / "staging" / config.name)
    else:
        store = LocalStore(Path(config.url).expanduser())
    compaction = None
    if options.compact:
        compaction = HourCompaction(config.url, where.node_id, s3=options.s3,
                                    after_s=options.compact_after_s)
        compaction.look_back()  # the hours written before this start
    return ParquetSink(config.name, store, options, node_id=where.node_id,
                       spool_id=where.spool_id, event_filter=where.event_filter,
                       compaction=compaction)


# each raises ValueError naming the problem; the keys are SinkConfig.type's values
_BUILDERS: Final[Mapping[str, Callable[[SinkConfig, _Where], Sink]]] = {
    "parquet": _parquet,
    "http": _http,
}
