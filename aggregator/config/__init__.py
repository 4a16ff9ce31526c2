"""The agent's configuration: the TOML file, EVAGG_* overrides and their defaults."""

from aggregator.config.agent_config import (
    DEFAULT_HTTP_LISTEN,
    AgentConfig,
    ConfigError,
    config_path,
    load_config,
    restart_only_settings,
)
from aggregator.config.client_view import (
    configured_http_listen,
    configured_lakes,
    configured_socket,
    configured_token_file,
)
from aggregator.config.config_warnings import check_host, config_warnings

__all__ = [
    "DEFAULT_HTTP_LISTEN",
    "AgentConfig",
    "ConfigError",
    "check_host",
    "config_path",
    "config_warnings",
    "configured_http_listen",
    "configured_lakes",
    "configured_socket",
    "configured_token_file",
    "load_config",
    "restart_only_settings",
]
