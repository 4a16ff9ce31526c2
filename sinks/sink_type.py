"""What a sink type is to the agent: the name a [[sinks]] table's `type` gives, the class
that reads the type's own options, what its urls must look like, and how it builds a sink
from its table. `sinks.registry` lists the types; each sink package defines its own
(`sinks/http/sink_type.py`, `sinks/parquet/sink_type.py`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sinks.base import Sink

if TYPE_CHECKING:
    from sinks.filters import EventFilter  # pyarrow: not for a config that is only read


@dataclass(frozen=True, slots=True)
class SinkPlace:
    """What building a sink needs besides its own table: where it runs."""

    node_id: str
    spool_id: str
    state_dir: Path
    event_filter: EventFilter
    retry_max_backoff_s: float  # the longest wait between two delivery attempts


class SinkOptions(Protocol):
    """A sink type's options class: the keys it owns (it reads them as it builds)."""

    KEYS: ClassVar[frozenset[str]]


# (name, url, the table's type-specific keys, where) -> a sink; raises ValueError
# (SinkOptionError for one option) when the options do not make one.
SinkBuilder = Callable[[str, str, Mapping[str, Any], SinkPlace], Sink]


@dataclass(frozen=True, slots=True)
class SinkType:
    name: str
    options: type[SinkOptions]
    url_problem: Callable[[str], str | None]  # what is wrong with a url; None: nothing
    build: SinkBuilder
    # Two sinks of this type on one url would overwrite each other's files.
    one_sink_per_url: bool = False
    # what is likely a mistake about a url that works (a config warning); None: nothing
    url_warning: Callable[[str], str | None] = lambda url: None
