"""The [[sinks]] tables of the agent's configuration: the keys every sink type takes, and
the checks that need no sink built (names, urls, filters). Each type's own keys, and how
they are read, belong to its options class (`sink_options()` names them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from aggregator.config.values import check_keys
from emitters import paths
from sinks.locations import S3Location, is_s3_url
from sinks.units import parse_positive_duration

if TYPE_CHECKING:
    from sinks.http.options import HttpOptions
    from sinks.parquet.options import ParquetOptions

SinkTypeName = Literal["parquet", "http"]  # the keys of sink_options()


@dataclass(frozen=True)
class SinkConfig:
    name: str
    type: SinkTypeName
    url: str
    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # type-specific, validated
    retry_max_backoff_s: float = 60.0  # the longest wait between two delivery attempts


COMMON_SINK_KEYS = {"name", "type", "url", "kinds", "sources", "names", "retry_max_backoff"}
_SINK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def sink_options() -> dict[str, type[ParquetOptions] | type[HttpOptions]]:
    """Each sink type and the class that owns its own keys (and reads them when its sink
    is built). Imported here, when sinks are read: the sinks' packages load aiohttp and
    pyarrow, which `evagg status` and `evagg tail` read the config without."""
    from sinks.http.options import HttpOptions
    from sinks.parquet.options import ParquetOptions

    return {"parquet": ParquetOptions, "http": HttpOptions}


def default_sink() -> SinkConfig:
    """The embedded default: Parquet in the user's data directory."""
    return SinkConfig(name="lake", type="parquet", url=str(paths.user_data_dir()))


def parse_sinks(raw: Any, problems: list[str]) -> tuple[SinkConfig, ...]:
    if raw is None:
        return (default_sink(),)
    if not isinstance(raw, list) or not raw:
        problems.append("sinks: must be a non-empty list of [[sinks]] tables")
        return ()
    out: list[SinkConfig] = []
    seen: set[str] = set()
    parquet_urls: set[str] = set()
    for index, table in enumerate(raw):
        sink = _sink(table, index, problems)
        if sink is None:
            continue
        if sink.name in seen:
            problems.append(f"sinks[{index}].name: {sink.name!r} is used by another sink")
        if sink.type == "parquet" and sink.url.rstrip("/") in parquet_urls:
            problems.append(
                f"sinks[{index}].url: another parquet sink writes to {sink.url!r}; "
                "their files would overwrite each other"
            )
        seen.add(sink.name)
        if sink.type == "parquet":
            parquet_urls.add(sink.url.rstrip("/"))
        out.append(sink)
    return tuple(out)


def _sink(table: Any, index: int, problems: list[str]) -> SinkConfig | None:
    label = f"sinks[{index}]"
    if not isinstance(table, dict):
        problems.append(f"{label}: must be a table")
        return None
    kind = table.get("type")
    options_of = sink_options()
    if not isinstance(kind, str) or kind not in options_of:
        problems.append(f"{label}.type: unknown sink type {kind!r} "
                        f"(known: {', '.join(options_of)})")
        return None
    check_keys(table, COMMON_SINK_KEYS | options_of[kind].KEYS, f"{label}.", problems)
    name = str(table.get("name", f"{kind}-{index}"))
    if not _SINK_NAME.match(name):
        problems.append(f"{label}.name: {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    url = table.get("url")
    if not isinstance(url, str) or not url:
        problems.append(f"{label}.url: required")
        return None
    _check_url(kind, url, f"{label}.url", problems)
    filters = {
        key: _string_list(table.get(key, []), f"{label}.{key}", problems)
        for key in ("kinds", "sources", "names")
    }
    options = {k: v for k, v in table.items() if k not in COMMON_SINK_KEYS}
    try:
        retry_cap = parse_positive_duration(table.get("retry_max_backoff", "60s"))
    except ValueError as exc:
        problems.append(f"{label}.retry_max_backoff: {exc}")
        retry_cap = 60.0
    return SinkConfig(
        name, cast(SinkTypeName, kind), url, filters["kinds"], filters["sources"],
        filters["names"], options, retry_cap,
    )


def _check_url(kind: str, url: str, label: str, problems: list[str]) -> None:
    if kind == "http" and not url.startswith(("http://", "https://")):
        problems.append(f"{label}: an http sink needs an http:// or https:// url")
    if kind == "parquet" and is_s3_url(url):
        try:
            S3Location.parse(url)
        except ValueError:
            problems.append(f"{label}: an s3 url needs a bucket (s3://bucket/prefix/)")
    elif kind == "parquet" and "://" in url:
        problems.append(f"{label}: a parquet sink takes a local directory or s3://bucket/prefix/")


def _string_list(value: Any, label: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{label}: must be a list of strings")
        return ()
    return tuple(value)
