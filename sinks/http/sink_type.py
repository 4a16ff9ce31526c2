"""The `http` sink type: batches POSTed to an http:// or https:// endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.base import Sink
from sinks.http.deadletter import dead_letter_dir
from sinks.http.options import HttpOptions
from sinks.http.sink import HttpSink
from sinks.sink_type import SinkPlace, SinkType


def _build(name: str, url: str, table: Mapping[str, Any], place: SinkPlace) -> Sink:
    return HttpSink(name, url, HttpOptions.from_table(table), spool_id=place.spool_id,
                    max_retry_backoff_s=place.retry_max_backoff_s,
                    event_filter=place.event_filter,
                    dead_letter_dir=dead_letter_dir(place.state_dir, name))


def _url_problem(url: str) -> str | None:
    if url.startswith(("http://", "https://")):
        return None
    return "an http sink needs an http:// or https:// url"


HTTP = SinkType("http", HttpOptions, _url_problem, _build)
