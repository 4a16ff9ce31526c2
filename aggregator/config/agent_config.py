"""Agent configuration: a TOML file, then EVAGG_* variables, then command-line flags.

Every error names the key and says why (`evagg check-config` prints them all).
With no file at all the agent runs the embedded default: a user-writable socket,
a spool under the user's state directory and one Parquet sink in a local directory.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import socket
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from aggregator.config.disk import spool_disk_warnings
from aggregator.config.files import WatchedFiles, files_warnings, parse_files
from aggregator.config.sinks import SinkConfig, default_sink, parse_sinks
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
from sinks.locations import is_loopback_host
from sinks.registry import sink_types
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
    if path is None and env.get("EVAGG_CONFIG"):
        path = Path(env["EVAGG_CONFIG"])
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(path)
    problems: list[str] = []
    check_keys(raw, {"agent", "spool", "sinks", "ray", "files"}, "", problems)
    agent = _table(raw, "agent", problems)
    spool = _table(raw, "spool", problems)
    check_keys(agent, _AGENT_KEYS, "agent.", problems)
    check_keys(spool, _SPOOL_KEYS, "spool.", problems)
    from_env = _apply_env(agent, env)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    agent.update(flags)
    config = _build(agent, spool, raw.get("sinks"), problems, path)
    if config is not None:
        config = _with_ray(config, _table(raw, "ray", problems), problems)
        config = dataclasses.replace(config, files=parse_files(raw.get("files"), problems))
    if problems or config is None:
        raise ConfigError(_name_variables(problems, {k: v for k, v in from_env.items()
                                                     if k not in flags}), config)
    return config


def configured_http_listen(
    path: Path | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The agent's http_listen ("" when disabled) as `evagg run` resolves it from the same
    file and variables, for `evagg tail` and `evagg status`. Only that key is checked: a
    client must not need to read the agent's token or header files."""
    agent, from_env = _client_agent_table(path, env)
    try:
        return listen(agent.get("http_listen", DEFAULT_HTTP_LISTEN))
    except ValueError as exc:
        raise ConfigError(_name_variables([f"agent.http_listen: {exc}"], from_env)) from None


def configured_socket(path: Path | None = None,
                      env: Mapping[str, str] | None = None) -> str | None:
    """The agent's socket as `evagg run` resolves it from the same file and variables, for
    `evagg emit`; None for the default (the producers' own rule finds it)."""
    agent, _ = _client_agent_table(path, env)
    socket = agent.get("socket")
    return str(Path(socket).expanduser()) if isinstance(socket, str) and socket else None


def restart_only_settings(path: Path | None) -> dict[str, Any]:
    """What of the file a reload does not apply (every table but [[sinks]]), keyed as the
    file names it (`spool.max_bytes`, `[[files]]`), for the agent to say which changed."""
    if path is None:
        return {}
    try:
        raw = _read_toml(path)
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


def configured_token_file(path: Path | None = None,
                          env: Mapping[str, str] | None = None) -> Path | None:
    """The agent's http_token_file from the same file and variables, for `evagg tail`:
    the client sends the token the agent wants; None when it wants none."""
    agent, _ = _client_agent_table(path, env)
    token = agent.get("http_token_file")
    return Path(token).expanduser() if isinstance(token, str) and token else None


def configured_lakes(path: Path | None = None,
                     env: Mapping[str, str] | None = None) -> tuple[SinkConfig, ...]:
    """The Parquet sinks of --config or $EVAGG_CONFIG (no [[sinks]]: the embedded
    default's), for the commands that read the lake the agent writes. Only [[sinks]] is
    checked: a reader must not need the agent's token or header files."""
    env = os.environ if env is None else env
    if path is None and env.get("EVAGG_CONFIG"):
        path = Path(env["EVAGG_CONFIG"])
    if path is None:
        return (default_sink(),)
    problems: list[str] = []
    sinks = parse_sinks(_read_toml(path).get("sinks"), problems)
    if problems:
        raise ConfigError([f"{path}: {problem}" for problem in problems])
    return tuple(sink for sink in sinks if sink.type == "parquet")


def _client_agent_table(path: Path | None, env: Mapping[str, str] | None
                        ) -> tuple[dict[str, Any], dict[str, str]]:
    """[agent] of --config or $EVAGG_CONFIG (none: empty) with the EVAGG_* variables
    applied, and which keys the variables set."""
    env = os.environ if env is None else env
    if path is None and env.get("EVAGG_CONFIG"):
        path = Path(env["EVAGG_CONFIG"])
    problems: list[str] = []
    agent = _table(_read_toml(path), "agent", problems) if path is not None else {}
    if problems:
        raise ConfigError(problems)
    return agent, _apply_env(agent, env)


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


_ENV_KEYS = {
    "EVAGG_SOCKET": "socket",
    "EVAGG_STATE_DIR": "state_dir",
    "EVAGG_HTTP_LISTEN": "http_listen",
    "EVAGG_NODE_ID": "node_id",
}


def _apply_env(agent: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Set the keys the EVAGG_* variables give; returns key -> the variable it came from."""
    applied = {}
    for variable, key in _ENV_KEYS.items():
        if env.get(variable):
            agent[key] = env[variable]
            applied[key] = variable
    return applied


def _name_variables(problems: list[str], from_env: Mapping[str, str]) -> list[str]:
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


def config_warnings(config: AgentConfig) -> list[str]:
    """What is allowed but likely a mistake; `check-config` prints it, the agent logs it."""
    warnings = [f"sinks[{index}] ({sink.name}).tls_verify: false: the endpoint's certificate "
                "is not checked, so whoever is on the path can read and change the events"
                for index, sink in enumerate(config.sinks) if _unverified(sink.options)]
    if 0 < config.inferred_end_grace_s < RAY_EXPORT_DELAY_S:
        warnings.append(f"agent.inferred_end_grace: {config.inferred_end_grace_s:g}s is shorter "
                        f"than Ray takes to export a dead driver's ends (about 5 s): keep it "
                        f"at {RAY_EXPORT_DELAY_S:g}s or more, or Ray's own end may come after "
                        "evagg inferred one")
    warnings.extend(files_warnings(config.files, [sink.type for sink in config.sinks]))
    warnings.extend(spool_disk_warnings(config.state_dir, config.spool_max_bytes))
    warnings.extend(token_file_warnings(config))
    warnings.extend(url_warnings(config))
    host = config.http_listen.rpartition(":")[0].strip("[]")
    if not host or config.http_token is not None or is_loopback_host(host):
        return warnings
    return [f"agent.http_listen: {config.http_listen} can be reached from other hosts and "
            "no http_token_file is set: anyone who reaches it can write events", *warnings]


def url_warnings(config: AgentConfig) -> list[str]:
    """A url its sink type finds likely wrong though it works: an HTTP sink pointed at an
    ingest API that wants another body (Elasticsearch's _bulk, Loki's push, ...)."""
    types = sink_types()
    warnings = []
    for index, sink in enumerate(config.sinks):
        kind = types.get(sink.type)
        said = kind.url_warning(sink.url) if kind is not None else None
        if said is not None:
            warnings.append(f"sinks[{index}] ({sink.name}).url: {said}")
    return warnings


def token_file_warnings(config: AgentConfig) -> list[str]:
    """A token file other users may read (or anyone but its owner may change) protects
    nothing from them: they send events and read /v1/tail with it."""
    if config.http_token is None or config.http_token_file is None:
        return []
    try:
        mode = stat.S_IMODE(config.http_token_file.stat().st_mode)
    except OSError:
        return []  # read a moment ago; a file gone since is the next start's error
    if not mode & 0o026:  # other users' read or write, the group's write
        return []
    return [f"agent.http_token_file: {config.http_token_file} has mode {mode:04o}: every "
            "local user can read (or change) the token, and so write events and read "
            f"them back; chmod 600 {config.http_token_file} (640 to let a group read it)"]


def _unverified(options: Mapping[str, Any]) -> bool:
    try:
        return not parse_bool(options.get("tls_verify", True))
    except ValueError:
        return False  # the sink's build names the bad value


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
