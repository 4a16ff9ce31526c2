"""A configured sink built by its type (`sinks.registry`), and how a sink that cannot be
built is reported.

Every [[sinks]] table goes through its type's options class, whether `evagg run` starts
the sinks, `evagg check-config` checks them or `evagg dlq replay` sends with an HTTP
sink's options, so they refuse the same option with the same message.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sinks.base import Sink
from sinks.filters import EventFilter
from sinks.options import SinkOptionError
from sinks.registry import sink_types
from sinks.sink_type import SinkPlace

if TYPE_CHECKING:
    from aggregator.config.sinks import SinkConfig

__all__ = ["SinkOptionError", "build_sink", "sink_problem"]


def build_sink(config: SinkConfig, *, node_id: str, spool_id: str, state_dir: Path) -> Sink:
    """Raises ValueError (SinkOptionError for one option) when the options don't make a sink."""
    place = SinkPlace(node_id, spool_id, state_dir,
                      EventFilter.of(config.kinds, config.sources, config.names),
                      config.retry_max_backoff_s)
    return sink_types()[config.type].build(config.name, config.url, config.options, place)


def sink_problem(index: int, config: SinkConfig, exc: Exception) -> str:
    """How a sink that cannot be built is reported, the same by every command."""
    if isinstance(exc, SinkOptionError):
        return f"sinks[{index}] ({config.name}).{exc.key}: {exc.reason}"
    return f"sinks[{index}] ({config.name}): {exc}"
