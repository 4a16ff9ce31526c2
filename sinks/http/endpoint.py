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
