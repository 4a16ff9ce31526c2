"""The [[sinks]] tables of the agent's configuration: the keys every sink type takes, and
the checks that need no sink built (names, urls, filters). Each type's own keys, its urls
and how it builds itself belong to the type (`sinks.registry` lists them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.config.values import check_keys
from emitters import paths
from sinks.registry import sink_types
from sinks.units import parse_positive_duration


@dataclass(frozen=True)
class SinkConfig:
    name: str
    type: str  # a key of sinks.registry.sink_types()
    url: str
    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # type-specific, validated
    retry_max_backoff_s: float = 60.0  # the longest wait between two delivery attempts


COMMON_SINK_KEYS = {"name", "type", "url", "kinds", "sources", "names", "retry_max_backoff"}
_SINK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def sink_name_problem(name: str) -> str:
    """Why `name` cannot name a sink ("" when it can): it names the sink's folders too
    (its dead letters), so no path separators and not "." or ".."."""
    if not _SINK_NAME.match(name) or not name.strip("."):
        return f"{name!r} must be 1-64 letters, digits, '.', '_' or '-', not only dots"
    return ""


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
    owned_urls: set[tuple[str, str]] = set()  # (type, url) of the types one_sink_per_url
    for index, table in enumerate(raw):
        sink = _sink(table, index, problems)
        if sink is None:
            continue
        if sink.name in seen:
            problems.append(f"sinks[{index}].name: {sink.name!r} is used by another sink")
        seen.add(sink.name)
        if sink_types()[sink.type].one_sink_per_url:
            owned = (sink.type, sink.url.rstrip("/"))
            if owned in owned_urls:
                problems.append(
                    f"sinks[{index}].url: another {sink.type} sink writes to {sink.url!r}; "
                    "their files would overwrite each other"
                )
            owned_urls.add(owned)
        out.append(sink)
    return tuple(out)


def _sink(table: Any, index: int, problems: list[str]) -> SinkConfig | None:
    label = f"sinks[{index}]"
    if not isinstance(table, dict):
        problems.append(f"{label}: must be a table")
        return None
    kind = table.get("type")
    types = sink_types()
    if kind is None:
        problems.append(f"{label}.type: required: one of {', '.join(types)}")
        return None
    if not isinstance(kind, str) or kind not in types:
        problems.append(f"{label}.type: unknown sink type {kind!r} "
                        f"(known: {', '.join(types)})")
        return None
    check_keys(table, COMMON_SINK_KEYS | types[kind].options.KEYS, f"{label}.", problems)
    name = str(table.get("name", f"{kind}-{index}"))
    named = sink_name_problem(name)
    if named:
        problems.append(f"{label}.name: {named}")
    url = table.get("url")
    if not isinstance(url, str) or not url:
        problems.append(f"{label}.url: required")
        return None
    url_problem = types[kind].url_problem(url)
    if url_problem:
        problems.append(f"{label}.url: {url_problem}")
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
        name, kind, url, filters["kinds"], filters["sources"],
        filters["names"], options, retry_cap,
    )


def _string_list(value: Any, label: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{label}: must be a list of strings")
        return ()
    return tuple(value)
