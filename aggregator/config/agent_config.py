"""Agent configuration: a TOML file, then EVAGG_* variables, then command-line flags.

Every error names the key and says why (`evagg check-config` prints them all).
With no file at all the agent runs the embedded default: a user-writable socket,
a spool under the user's state directory and one Parquet sink in a local directory.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from aggregator.config.files import WatchedFiles, parse_files
from aggregator.config.sinks import SinkConfig, parse_sinks
from aggregator.config.values import (
    check_keys,
    connection_cap,
    grace,
    group,
    label_cap,
    listen,
    octal_mode,
    one_of,
    path_or,
    read_token,
    string,
)
from emitters import paths
from emitters.handoff import Settings
from sinks.units import (
    parse_bool,
    parse_duration,
    parse_positive_duration,
    parse_positive_size,
    parse_size,
    size_text,
)

DEFAULT_RAY_LOG_DIR = "/tmp/ray"  # Ray's own default --temp-dir


class ConfigError(ValueError):
    """One or more configuration problems, each naming its key."""

    def __init__(self, problems: list[str], partial: AgentConfig | None = None) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        # The config as read, defaults standing in for the values refused: what
        # `check-config` still checks (warnings, the host) so that it says every problem.
        self.partial = partial


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
    max_connections: int = 1024  # producer connections served at once; the rest refused
    ray_log_dir: str = DEFAULT_RAY_LOG_DIR  # Ray's temp root; "" collects no Ray logs
    inferred_end_grace_s: float = 30.0  # 0: no inferred ends (aggregator/liveness/)
    files: tuple[WatchedFiles, ...] = ()  # [[files]]: directories shipped as artifacts
    http_token_file: Path | None = None  # where http_token was read, for its mode


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
    "max_connections",
    "inferred_end_grace",
}
_SPOOL_KEYS = {"max_bytes", "when_full", "fsync", "segment_bytes"}
DEFAULT_HTTP_LISTEN = "127.0.0.1:4040"
RAY_EXPORT_DELAY_S = 10.0  # a grace under this may race Ray's own ends (docs/ray.md)


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """Read the file (if any), apply EVAGG_* variables and flag overrides, validate."""
    env = os.environ if env is None else env
    path = config_path(path, env)
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_toml(path)
    problems: list[str] = []
    check_keys(raw, {"agent", "spool", "sinks", "ray", "files"}, "", problems)
    agent = table_of(raw, "agent", problems)
    spool = table_of(raw, "spool", problems)
    check_keys(agent, _AGENT_KEYS, "agent.", problems)
    check_keys(spool, _SPOOL_KEYS, "spool.", problems)
    from_env = apply_env(agent, env)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    agent.update(flags)
    config = _build(agent, spool, raw.get("sinks"), problems, path)
    if config is not None:
        config = _with_ray(config, table_of(raw, "ray", problems), problems)
        config = dataclasses.replace(config, files=parse_files(raw.get("files"), problems))
    if problems or config is None:
        raise ConfigError(name_variables(problems, {k: v for k, v in from_env.items()
                                                     if k not in flags}), config)
    return config


def config_path(path: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The config file: --config, else $EVAGG_CONFIG; None for the embedded default."""
    env = os.environ if env is None else env
    if path is None and env.get("EVAGG_CONFIG"):
        return Path(env["EVAGG_CONFIG"])
    return path


def restart_only_settings(path: Path | None) -> dict[str, Any]:
    """What of the file a reload does not apply (every table but [[sinks]]), keyed as the
    file names it (`spool.max_bytes`, `[[files]]`), for the agent to say which changed."""
    if path is None:
        return {}
    try:
        raw = read_toml(path)
    except ConfigError:
        return {}
    found: dict[str, Any] = {}
    for table, value in raw.items():
        if table == "sinks":
            continue
        if isinstance(value, dict):
            found.update({f"{table}.{key}": item for key, item in value.items()})
        else:
            found[f"[[{table}]]" if isinstance(value, list) else table] = value
    return found


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError([f"config file {path} does not exist"]) from None
    except PermissionError:
        raise ConfigError([f"config file {path} is not readable"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"config file {path} is not valid TOML: {exc}"]) from None


def table_of(raw: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        problems.append(f"{key}: must be a table ([{key}])")
        return {}
    return dict(value)


_ENV_KEYS = {
    "EVAGG_SOCKET": "socket",
    "EVAGG_STATE_DIR": "state_dir",
    "EVAGG_HTTP_LISTEN": "http_listen",
    "EVAGG_NODE_ID": "node_id",
}


def apply_env(agent: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Set the keys the EVAGG_* variables give; returns key -> the variable it came from."""
    applied = {}
    for variable, key in _ENV_KEYS.items():
        if env.get(variable):
            agent[key] = env[variable]
            applied[key] = variable
    return applied


def name_variables(problems: list[str], from_env: Mapping[str, str]) -> list[str]:
    """A problem with a value from the environment says which variable set it."""
    out = []
    for problem in problems:
        key = problem.partition(":")[0].removeprefix("agent.")
        if problem.startswith("agent.") and key in from_env:
            problem = f"agent.{key} (from ${from_env[key]}){problem[len('agent.' + key):]}"
        out.append(problem)
    return out


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

    node_id = get(agent, "node_id", "auto", string, "agent.")
    host = socket.gethostname()
    if node_id in ("", "auto"):
        node_id = host
    config = AgentConfig(
        node_id=node_id,
        host=host,
        socket=get(agent, "socket", "", path_or(paths.user_socket_path), "agent."),
        socket_mode=get(agent, "socket_mode", "0660", octal_mode, "agent."),
        socket_group=get(agent, "socket_group", "", group, "agent."),
        state_dir=get(agent, "state_dir", "", path_or(paths.user_state_dir), "agent."),
        http_listen=get(agent, "http_listen", DEFAULT_HTTP_LISTEN, listen, "agent."),
        http_token=get(agent, "http_token_file", None, read_token, "agent."),
        http_max_body_bytes=get(agent, "http_max_body", "64MiB", parse_positive_size, "agent."),
        max_frame_bytes=get(agent, "max_frame", "4MiB", parse_positive_size, "agent."),
        frame_timeout_s=get(agent, "frame_timeout", "10s", parse_positive_duration, "agent."),
        spool_max_bytes=get(spool, "max_bytes", "4GiB", parse_size, "spool."),
        spool_when_full=get(spool, "when_full", "block", one_of("block", "drop_oldest"), "spool."),
        spool_fsync=get(spool, "fsync", "os", one_of("os", "always"), "spool."),
        spool_segment_bytes=get(spool, "segment_bytes", "64MiB", parse_size, "spool."),
        drain_timeout_s=get(agent, "drain_timeout", "60s", parse_duration, "agent."),
        heartbeat_interval_s=get(agent, "heartbeat_interval", "30s", parse_positive_duration,
                                 "agent."),
        sinks=parse_sinks(sinks_raw, problems),
        source_path=path,
        http_token_file=(Path(agent["http_token_file"]) if isinstance(
            agent.get("http_token_file"), str) and agent["http_token_file"] else None),
        red_metrics=get(agent, "red_metrics", True, parse_bool, "agent."),
        red_max_names=get(agent, "red_max_names", 200, label_cap, "agent."),
        max_connections=get(agent, "max_connections", 1024, connection_cap, "agent."),
        inferred_end_grace_s=get(agent, "inferred_end_grace", "30s", grace, "agent."),
    )
    # A frame's Arrow record can be larger than its NDJSON; the spool holds records of at
    # most a quarter of max_bytes and one segment, so leave a factor of two on top.
    problems += frame_room_problems(config)
    return config


PRODUCER_FRAME_BYTES: Final = Settings().max_frame_bytes  # the library's default frame


def frame_room_problems(config: AgentConfig) -> list[str]:
    """The spool must hold the largest frame a producer may send, with room to spare."""
    frame = config.max_frame_bytes
    problems = []
    for key, have, times, words in (("max_bytes", config.spool_max_bytes, 8, "eight times"),
                                    ("segment_bytes", config.spool_segment_bytes, 2, "twice")):
        if have < times * frame:
            # a smaller max_frame is a way out only where producers' frames still fit
            smaller = (f", or agent.max_frame to at most {size_text(have // times)}"
                       if have // times >= PRODUCER_FRAME_BYTES else "")
            problems.append(
                f"spool.{key}: {size_text(have)} is less than {words} agent.max_frame "
                f"({size_text(frame)}): set spool.{key} to at least "
                f"{size_text(times * frame)}{smaller}")
    return problems


def _with_ray(config: AgentConfig, ray: dict[str, Any], problems: list[str]) -> AgentConfig:
    """[ray] log_dir: the root of Ray's files on this node (docs/ray-logs.md)."""
    check_keys(ray, {"log_dir"}, "ray.", problems)
    value = ray.get("log_dir", DEFAULT_RAY_LOG_DIR)
    if not isinstance(value, str):
        problems.append("ray.log_dir: must be a path (Ray's --temp-dir, default /tmp/ray), "
                        'or "" to collect no Ray log files')
        return config
    if value and not Path(value).expanduser().is_absolute():
        problems.append(f"ray.log_dir: {value!r} is not an absolute path; give Ray's "
                        "--temp-dir as Ray prints it (default /tmp/ray)")
        return config
    return dataclasses.replace(config, ray_log_dir=value)
