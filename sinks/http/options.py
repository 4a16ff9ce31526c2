"""Options of the HTTP sink checked before it starts, and header values resolved.

Header values may be literal, `env:NAME` or `file:/path`; a missing variable or an
unreadable file is an error here, at start (and in `evagg check-config`), never a
failure at the first request. Messages name the header, never its value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from sinks.http.endpoint import CONTENT_TYPES, HttpSinkConfigError, url_for_display

_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name



def resolve_headers(
    spec: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """Header values: literal, `env:NAME` from the environment, or `file:/path`, stripped."""
    resolved = {}
    for name, value in spec.items():
        if not isinstance(value, str) or not _TOKEN.fullmatch(str(name)):
            raise HttpSinkConfigError(f"header {name!r}: name must be a token, value a string")
        if value.startswith("env:"):
            variable = value[4:]
            if variable not in environ:
                raise HttpSinkConfigError(
                    f"header {name!r}: environment variable {variable} is not set")
            value = environ[variable]
        elif value.startswith("file:"):
            path = value[5:]
            try:
                value = Path(path).read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                raise HttpSinkConfigError(
                    f"header {name!r}: cannot read file {path}: {reason}") from None
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise HttpSinkConfigError(f"header {name!r}: a header cannot contain a line break")
        resolved[name] = value
    return resolved


def check_options(url: str, headers: Mapping[str, str], body_format: str, gzip_level: int,
                  max_events: int, max_bytes: int, interval_s: float, timeout_s: float,
                  max_in_flight: int) -> None:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        raise HttpSinkConfigError("url has a port that is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpSinkConfigError(
            f"url must be an http:// or https:// URL, got {url_for_display(url)!r}")
    if parts.username is not None and any(k.lower() == "authorization" for k in headers):
        raise HttpSinkConfigError("url has user info and headers set Authorization: keep one")
    if body_format not in CONTENT_TYPES:
        raise HttpSinkConfigError(f"format must be 'ndjson' or 'json', got {body_format!r}")
    if not -1 <= gzip_level <= 9:
        raise HttpSinkConfigError(f"gzip_level must be -1..9, got {gzip_level!r}")
    for key, value in (("batch_max_events", max_events), ("batch_max_bytes", max_bytes),
                       ("batch_interval", interval_s), ("timeout", timeout_s),
                       ("max_in_flight", max_in_flight)):
        if not value > 0:
            raise HttpSinkConfigError(f"{key} must be positive, got {value!r}")
