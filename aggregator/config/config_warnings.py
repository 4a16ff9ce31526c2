"""What a configuration that loads may still get wrong: the warnings `evagg check-config`
prints and the agent logs at start, and what only the host that runs the agent can
answer (`check_host`).
"""

from __future__ import annotations

import grp
import stat
from collections.abc import Mapping
from typing import Any

from aggregator.config.agent_config import RAY_EXPORT_DELAY_S, AgentConfig, ConfigError
from aggregator.config.disk import spool_disk_warnings
from aggregator.config.files import files_warnings
from sinks.locations import is_loopback_host
from sinks.registry import sink_types
from sinks.units import parse_bool


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
