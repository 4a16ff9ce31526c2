"""What the client commands read of the agent's configuration: the socket `evagg emit`
writes to, the port and token `evagg tail` and `evagg status` use, the lakes `evagg
query` and `evagg dashboard` read. Each is resolved from the same file and EVAGG_*
variables as `evagg run` resolves it, and checks only what it reads: a client must not
need the agent's token or header files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aggregator.config.agent_config import (
    DEFAULT_HTTP_LISTEN,
    ConfigError,
    apply_env,
    config_path,
    name_variables,
    read_toml,
    table_of,
)
from aggregator.config.sinks import SinkConfig, default_sink, parse_sinks
from aggregator.config.values import listen


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
        raise ConfigError(name_variables([f"agent.http_listen: {exc}"], from_env)) from None


def configured_socket(path: Path | None = None,
                      env: Mapping[str, str] | None = None) -> str | None:
    """The agent's socket as `evagg run` resolves it from the same file and variables, for
    `evagg emit`; None for the default (the producers' own rule finds it)."""
    agent, _ = _client_agent_table(path, env)
    socket = agent.get("socket")
    return str(Path(socket).expanduser()) if isinstance(socket, str) and socket else None


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
    path = config_path(path, env)
    if path is None:
        return (default_sink(),)
    problems: list[str] = []
    sinks = parse_sinks(read_toml(path).get("sinks"), problems)
    if problems:
        raise ConfigError([f"{path}: {problem}" for problem in problems])
    return tuple(sink for sink in sinks if sink.type == "parquet")


def _client_agent_table(path: Path | None, env: Mapping[str, str] | None
                        ) -> tuple[dict[str, Any], dict[str, str]]:
    """[agent] of --config or $EVAGG_CONFIG (none: empty) with the EVAGG_* variables
    applied, and which keys the variables set."""
    env = os.environ if env is None else env
    path = config_path(path, env)
    problems: list[str] = []
    agent = table_of(read_toml(path), "agent", problems) if path is not None else {}
    if problems:
        raise ConfigError(problems)
    return agent, apply_env(agent, env)
