"""Agent configuration: a TOML file, then EVAGG_* variables, then command-line flags.

Every error names the key and says why (`evagg check-config` prints them all).
With no file at all the agent runs the embedded default: a user-writable socket,
a spool under the user's state directory and one Parquet sink in a local directory.
"""

from __future__ import annotations

import grp
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aggregator.units import parse_duration, parse_positive_duration, parse_size
from emitters import paths


class ConfigError(ValueError):
    """One or more configuration problems, each naming its key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class SinkConfig:
    name: str
    type: Literal["parquet", "http"]
    url: str
    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # type-specific, validated
    retry_max_backoff_s: float = 60.0  # the longest wait between two delivery attempts


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    host: str
    socket: Path
    socket_mode: int
    socket_group: str | None
    state_dir: Path
    http_listen: str  # host:port, or "" to disable
    http_token: str | None  # bearer token required on ingest routes when set
    http_max_body_bytes: int
    max_frame_bytes: int
    frame_timeout_s: float
    spool_max_bytes: int
    spool_when_full: Literal["block", "drop_oldest"]
    spool_fsync: Literal["os", "always"]
    spool_segment_bytes: int
    drain_timeout_s: float
    heartbeat_interval_s: float
    sinks: tuple[SinkConfig, ...]
    source_path: Path | None = None
    red_metrics: bool = True  # RED metrics derived from events on /metrics
    red_max_names: int = 200  # distinct names per kind before "other"


_AGENT_KEYS = {
    "node_id",
    "socket",
    "socket_mode",
    "socket_group",
    "state_dir",
    "http_listen",
    "http_token_file",
    "http_max_body",
    "max_frame",
    "frame_timeout",
    "drain_timeout",
    "heartbeat_interval",
    "red_metrics",
    "red_max_names",
}
_SPOOL_KEYS = {"max_bytes", "when_full", "fsync", "segment_bytes"}
_COMMON_SINK_KEYS = {"name", "type", "url", "kinds", "sources", "names", "retry_max_backoff"}
SINK_KEYS: dict[str, set[str]] = {
    "parquet": {
        "roll_max_bytes",
        "roll_interval",
        "row_group_rows",
        "endpoint_url",
        "region",
        "path_style",
        "multipart_threshold",
    },
    "http": {
        "format",
        "gzip",
        "gzip_level",
        "headers",
        "batch_max_events",
        "batch_max_bytes",
        "batch_interval",
        "timeout",
        "max_in_flight",
    },
}
DEFAULT_HTTP_LISTEN = "127.0.0.1:4040"
_SINK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """Read the file (if any), apply EVAGG_* variables and flag overrides, validate."""
    env = os.environ if env is None else env
    if path is None and env.get("EVAGG_CONFIG"):
        path = Path(env["EVAGG_CONFIG"])
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(path)
    problems: list[str] = []
    _check_keys(raw, {"agent", "spool", "sinks"}, "", problems)
    agent = _table(raw, "agent", problems)
    spool = _table(raw, "spool", problems)
    _check_keys(agent, _AGENT_KEYS, "agent.", problems)
    _check_keys(spool, _SPOOL_KEYS, "spool.", problems)
    _apply_env(agent, env)
    agent.update({k: v for k, v in (overrides or {}).items() if v is not None})
    config = _build(agent, spool, raw.get("sinks"), problems, path)
    if problems or config is None:
        raise ConfigError(problems)
    return config


def configured_http_listen(
    path: Path | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The agent's http_listen ("" when disabled) as `evagg run` resolves it from the same
    file and variables, for `evagg tail` and `evagg status`. Only that key is checked: a
    client must not need to read the agent's token or header files."""
    env = os.environ if env is None else env
    if path is None and env.get("EVAGG_CONFIG"):
        path = Path(env["EVAGG_CONFIG"])
    problems: list[str] = []
    agent = _table(_read_toml(path), "agent", problems) if path is not None else {}
    if problems:
        raise ConfigError(problems)
    _apply_env(agent, env)
    try:
        return _listen(agent.get("http_listen", DEFAULT_HTTP_LISTEN))
    except ValueError as exc:
        raise ConfigError([f"agent.http_listen: {exc}"]) from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError([f"config file {path} does not exist"]) from None
    except PermissionError:
        raise ConfigError([f"config file {path} is not readable"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"config file {path} is not valid TOML: {exc}"]) from None


def _table(raw: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        problems.append(f"{key}: must be a table ([{key}])")
        return {}
    return dict(value)


def _check_keys(
    table: Mapping[str, Any], allowed: set[str], prefix: str, problems: list[str]
) -> None:
    for key in table:
        if key not in allowed:
            problems.append(f"{prefix}{key}: unknown key (allowed: {', '.join(sorted(allowed))})")


_ENV_KEYS = {
    "EVAGG_SOCKET": "socket",
    "EVAGG_STATE_DIR": "state_dir",
    "EVAGG_HTTP_LISTEN": "http_listen",
    "EVAGG_NODE_ID": "node_id",
}


def _apply_env(agent: dict[str, Any], env: Mapping[str, str]) -> None:
    for variable, key in _ENV_KEYS.items():
        if env.get(variable):
            agent[key] = env[variable]


def _build(
    agent: dict[str, Any],
    spool: dict[str, Any],
    sinks_raw: Any,
    problems: list[str],
    path: Path | None,
) -> AgentConfig | None:
    def get(table: dict[str, Any], key: str, default: Any, parse: Any, label: str) -> Any:
        if key not in table:
            return parse(default) if default is not None else None
        try:
            return parse(table[key])
        except (ValueError, TypeError) as exc:
            problems.append(f"{label}{key}: {exc}")
            return parse(default) if default is not None else None

    node_id = get(agent, "node_id", "auto", _text, "agent.")
    host = socket.gethostname()
    if node_id in ("", "auto"):
        node_id = host
    config = AgentConfig(
        node_id=node_id,
        host=host,
        socket=get(agent, "socket", "", _path_or(paths.user_socket_path), "agent."),
        socket_mode=get(agent, "socket_mode", "0660", _octal_mode, "agent."),
        socket_group=get(agent, "socket_group", "", _group, "agent."),
        state_dir=get(agent, "state_dir", "", _path_or(paths.user_state_dir), "agent."),
        http_listen=get(agent, "http_listen", DEFAULT_HTTP_LISTEN, _listen, "agent."),
        http_token=get(agent, "http_token_file", None, _read_token, "agent."),
        http_max_body_bytes=get(agent, "http_max_body", "64MiB", parse_size, "agent."),
        max_frame_bytes=get(agent, "max_frame", "4MiB", parse_size, "agent."),
        frame_timeout_s=get(agent, "frame_timeout", "10s", parse_positive_duration, "agent."),
        spool_max_bytes=get(spool, "max_bytes", "4GiB", parse_size, "spool."),
        spool_when_full=get(spool, "when_full", "block", _one_of("block", "drop_oldest"), "spool."),
        spool_fsync=get(spool, "fsync", "os", _one_of("os", "always"), "spool."),
        spool_segment_bytes=get(spool, "segment_bytes", "64MiB", parse_size, "spool."),
        drain_timeout_s=get(agent, "drain_timeout", "60s", parse_duration, "agent."),
        heartbeat_interval_s=get(agent, "heartbeat_interval", "30s", parse_positive_duration,
                                 "agent."),
        sinks=_sinks(sinks_raw, problems),
        source_path=path,
        red_metrics=get(agent, "red_metrics", True, _boolean, "agent."),
        red_max_names=get(agent, "red_max_names", 200, _label_cap, "agent."),
    )
    # A frame's Arrow record can be larger than its NDJSON; the spool holds records of at
    # most a quarter of max_bytes and one segment, so leave a factor of two on top.
    if config.spool_max_bytes < 8 * config.max_frame_bytes:
        problems.append("spool.max_bytes: must be at least eight times agent.max_frame")
    if config.spool_segment_bytes < 2 * config.max_frame_bytes:
        problems.append("spool.segment_bytes: must be at least twice agent.max_frame")
    return config


def check_host(config: AgentConfig) -> None:
    """What only the host that runs the agent can answer, for `evagg check-config` and
    `evagg run` (load_config itself reads another host's config fine)."""
    group = config.socket_group
    if group is None:
        return
    try:
        grp.getgrnam(group)
    except KeyError:
        raise ConfigError([f"agent.socket_group: no group named {group!r} on this host "
                           "(create it, or remove the key)"]) from None


def default_sink() -> SinkConfig:
    """The embedded default: Parquet in the user's data directory."""
    return SinkConfig(name="lake", type="parquet", url=str(paths.user_data_dir()))


def _sinks(raw: Any, problems: list[str]) -> tuple[SinkConfig, ...]:
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
    if kind not in SINK_KEYS:
        problems.append(f"{label}.type: unknown sink type {kind!r} (known: parquet, http)")
        return None
    _check_keys(table, _COMMON_SINK_KEYS | SINK_KEYS[kind], f"{label}.", problems)
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
    options = {k: v for k, v in table.items() if k not in _COMMON_SINK_KEYS}
    try:
        retry_cap = parse_positive_duration(table.get("retry_max_backoff", "60s"))
    except ValueError as exc:
        problems.append(f"{label}.retry_max_backoff: {exc}")
        retry_cap = 60.0
    return SinkConfig(
        name, kind, url, filters["kinds"], filters["sources"], filters["names"], options,
        retry_cap,
    )


def _check_url(kind: str, url: str, label: str, problems: list[str]) -> None:
    if kind == "http" and not url.startswith(("http://", "https://")):
        problems.append(f"{label}: an http sink needs an http:// or https:// url")
    if kind == "parquet" and url.startswith("s3://"):
        bucket = url[len("s3://") :].split("/", 1)[0]
        if not bucket:
            problems.append(f"{label}: an s3 url needs a bucket (s3://bucket/prefix/)")
    elif kind == "parquet" and "://" in url:
        problems.append(f"{label}: a parquet sink takes a local directory or s3://bucket/prefix/")


def _string_list(value: Any, label: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{label}: must be a list of strings")
        return ()
    return tuple(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (quote it)")
    return value


def _path_or(default: Any) -> Any:
    """A path from a string; "" (or no key) means the user default."""
    def parse(value: Any) -> Path:
        text = _text(value)
        return Path(text) if text else Path(default())

    return parse


def _group(value: Any) -> str | None:
    return _text(value) or None


def _octal_mode(value: Any) -> int:
    text = str(value)
    if not re.fullmatch(r"0?[0-7]{3}", text):
        raise ValueError(f'{text!r} is not an octal file mode such as "0660"')
    return int(text, 8)


def _listen(value: Any) -> str:
    text = str(value)
    if text == "":
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f'{text!r} is not host:port, such as "127.0.0.1:4040"')
    return text


def _read_token(value: Any) -> str:
    try:
        token = Path(str(value)).read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read token file: {exc.strerror}") from None
    if not token:
        raise ValueError("the token file is empty")
    return token


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _label_cap(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ValueError(f"{value!r} is not a whole number from 1 to 100000")
    return value


def _one_of(*choices: str) -> Any:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return str(value)

    return parse
