"""What every part of the HTTP sink says about an endpoint: how its URL is shown (never
with credentials), the body formats it can be sent, and the error a bad option raises."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

CONTENT_TYPES: Final = {"ndjson": "application/x-ndjson", "json": "application/json"}


class HttpSinkConfigError(ValueError):
    """A configuration the HTTP sink cannot start with; the message says which key."""


def url_for_display(url: str) -> str:
    """The URL without user info and query, which may carry credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # a port that is not a number: show none
        netloc = host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# Ingest APIs that want a shape of their own, not the sink's bare events: (path suffix,
# what it wants). Sent there, every batch comes back 400 and becomes a dead letter.
_OTHER_SHAPES: Final = (
    ("/_bulk", "Elasticsearch/OpenSearch _bulk needs an action line before each event"),
    ("/loki/api/v1/push", "Loki's push API needs its streams/values shape"),
    ("/services/collector/event", "Splunk HEC's event endpoint needs each event wrapped in "
     "{\"event\": ...}: use /services/collector/raw"),
    ("/services/collector", "Splunk HEC's event endpoint needs each event wrapped in "
     "{\"event\": ...}: use /services/collector/raw"),
)


def other_shape(url: str) -> str | None:
    """Why an endpoint at `url` will refuse the sink's bodies, when its path is an ingest
    API known to want another shape (docs/sinks-http.md, "Backends you may already run")."""
    path = urlsplit(url).path.rstrip("/")
    for suffix, wants in _OTHER_SHAPES:
        if path.endswith(suffix):
            return wants
    return None
