"""The `http` sink type: batches POSTed to an http:// or https:// endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.base import Sink
from sinks.http.deadletter import dead_letter_dir
from sinks.http.endpoint import other_shape
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


def _url_warning(url: str) -> str | None:
    wants = other_shape(url)
    if wants is None:
        return None
    return (f"{wants}, not the events the sink sends, so every batch would be refused and "
            "dead-lettered; see docs/sinks-http.md, \"Backends you may already run\" (a "
            "relay)")


HTTP = SinkType("http", HttpOptions, _url_problem, _build, url_warning=_url_warning)
