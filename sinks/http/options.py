"""The HTTP sink's options: their defaults, how a [[sinks]] table's keys are read into
them, and the header values resolved.

`HttpOptions` is the one owner of every default; `HttpOptions.from_table` is the one
reading of a table, used by `evagg run`, `evagg check-config` and `evagg dlq replay`.
Header values may be literal, `env:NAME` or `file:/path`; a missing variable or an
unreadable file is an error here, at start (and in `evagg check-config`), never a
failure at the first request. A `file:` value is read again by the sink whenever its
file changes (`sinks.http.header_files`), so a rotated token needs no reload.
Messages name the header, never its value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from sinks.http.batches import BodyFormat
from sinks.http.endpoint import HttpSinkConfigError, url_for_display
from sinks.http.tls import TlsOptions
from sinks.options import (
    SinkOptionError,
    at_least,
    int_between,
    one_of,
    option,
    optional_text,
    text,
    text_table,
)
from sinks.units import parse_bool, parse_positive_duration, parse_positive_size

MIB: Final = 1024 * 1024
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name


def parse_concurrency(value: Any) -> int | None:
    """`"adaptive"` (None) or a fixed number of requests in flight, at least 1."""
    if value == "adaptive" or value is None:
        return None
    if isinstance(value, str):
        raise ValueError(f"{value!r} is neither \"adaptive\" nor a number of requests")
    return at_least(1)(value)


# config key -> (HttpOptions field, parser of the TOML value)
_KEYS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "batch_max_events": ("batch_max_events", at_least(1)),
    "batch_max_bytes": ("batch_max_bytes", parse_positive_size),
    "batch_interval": ("batch_interval_s", parse_positive_duration),
    "format": ("body_format", one_of("ndjson", "json")),
    "gzip": ("gzip", parse_bool),
    "gzip_level": ("gzip_level", int_between(-1, 9, "a zlib level")),
    "timeout": ("timeout_s", parse_positive_duration),
    "max_in_flight": ("max_in_flight", at_least(1)),
    "concurrency": ("concurrency", parse_concurrency),
    "proxy": ("proxy", text),
}
# config key -> (TlsOptions field, parser)
_TLS_KEYS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "tls_ca_file": ("ca_file", optional_text),
    "tls_cert_file": ("cert_file", optional_text),
    "tls_key_file": ("key_file", optional_text),
    "tls_verify": ("verify", parse_bool),
}


@dataclass(frozen=True)
class HttpOptions:
    """Everything an HTTP sink is configured with besides its name and url. The field
    defaults are the documented defaults (docs/configuration.md)."""

    batch_max_events: int = 1000
    batch_max_bytes: int = 4 * MIB
    batch_interval_s: float = 1.0
    body_format: BodyFormat = "ndjson"
    gzip: bool = False
    gzip_level: int = 1  # 5.6x on event JSON at 2.5x the speed of level 6
    # resolved values (env: and file: read); never in repr: they hold credentials
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # header name -> path of the `file:` values, which the sink reads again when they change
    header_files: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = 10.0
    max_in_flight: int = 4
    # None ("adaptive"): follows the endpoint, 1..max_in_flight; N: always N in flight
    concurrency: int | None = None
    tls: TlsOptions = field(default_factory=TlsOptions)
    proxy: str = "env"  # "env", "none" or the proxy's URL

    KEYS: ClassVar[frozenset[str]] = frozenset({*_KEYS, *_TLS_KEYS, "headers"})

    @classmethod
    def from_table(cls, table: Mapping[str, Any],
                   environ: Mapping[str, str] = os.environ) -> HttpOptions:
        """The options of a [[sinks]] table's type-specific keys, checked as far as they
        can be without the url or the network; raises SinkOptionError naming the key."""
        for key in table:
            if key not in cls.KEYS:
                raise SinkOptionError(key, "is not an option of an http sink")
        defaults, no_tls = cls(), TlsOptions()
        values = {name: option(table, key, getattr(defaults, name), parse)
                  for key, (name, parse) in _KEYS.items()}
        tls = {name: option(table, key, getattr(no_tls, name), parse)
               for key, (name, parse) in _TLS_KEYS.items()}
        spec: dict[str, str] = option(table, "headers", {}, text_table)
        headers = resolve_headers(spec, environ)
        files = {name: value[5:] for name, value in spec.items() if value.startswith("file:")}
        fixed = values["concurrency"]
        if fixed is not None and fixed > values["max_in_flight"]:
            raise SinkOptionError("concurrency", f"{fixed} is more than max_in_flight "
                                  f"({values['max_in_flight']}): raise max_in_flight too")
        return cls(**values, headers=headers, header_files=files, tls=TlsOptions(**tls))


def resolve_headers(
    spec: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """Header values: literal, `env:NAME` from the environment, or `file:/path`, stripped.
    Raises SinkOptionError("headers", ...) naming every header that cannot be resolved
    (so one run of `evagg check-config` lists them all), never a value."""
    resolved, problems = {}, []
    for name, value in spec.items():
        try:
            resolved[name] = _header_value(name, value, environ)
        except ValueError as exc:
            problems.append(f"{name!r}: {exc}")
    if problems:
        raise SinkOptionError("headers", "; ".join(problems))
    return resolved


def _header_value(name: object, value: object, environ: Mapping[str, str]) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(str(name)):
        raise ValueError("name must be a token, value a string")
    if value.startswith("env:"):
        variable = value[4:]
        if variable not in environ:
            raise ValueError(f"environment variable {variable} is not set")
        value = environ[variable]
    elif value.startswith("file:"):
        value = _read_header_file(value[5:])
    if "\r" in value or "\n" in value:
        raise ValueError("a header cannot contain a line break")
    return value


def read_header_file(name: str, path: str) -> str:
    """A `file:` header's value as read now; ValueError says why it cannot be used."""
    return _header_value(name, "file:" + path, {})


def _read_header_file(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ValueError(f"cannot read file {path}: {reason}") from None


def check_url(url: str, options: HttpOptions) -> None:
    """The endpoint's url, and what it must agree on with the options."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        raise HttpSinkConfigError("url has a port that is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpSinkConfigError(
            f"url must be an http:// or https:// URL, got {url_for_display(url)!r}")
    if parts.username is not None and any(k.lower() == "authorization"
                                          for k in options.headers):
        raise HttpSinkConfigError("url has user info and headers set Authorization: keep one")
    if not options.tls.is_default and parts.scheme != "https":
        raise HttpSinkConfigError("tls_* options need an https:// url")
