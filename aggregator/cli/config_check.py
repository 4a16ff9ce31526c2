"""Every problem of a config at once, for `evagg check-config` and `evagg run`.

`load_config` lists the problems of the agent's tables and of the sinks' common keys; a
sink's own options are checked only when the sink is built, and a build stops at the
first bad option. Here each sink is built again without the option just refused, so one
run names every bad option, and a config whose other tables are wrong still has its
sinks' options checked. A problem already said (by any check) is not said twice.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from aggregator.config import (
    AgentConfig,
    ConfigError,
    check_host,
    config_path,
    config_warnings,
    load_config,
)
from aggregator.config.sinks import SinkConfig, parse_sinks
from aggregator.delivery.build import build_sink, sink_problem
from sinks.locations import is_s3_url


def load_checked(path: Path | None, overrides: dict[str, object]) -> AgentConfig:
    """The config, or ConfigError listing every problem found (its `partial` config, when
    there is one, gives `check-config` the warnings to show beside them)."""
    try:
        config = load_config(path, overrides=overrides)
    except ConfigError as exc:
        more = sink_option_problems(_sinks_of(path), Path("."))
        if exc.partial is not None and not _names_key(exc.problems, "agent.state_dir"):
            more = [*state_dir_problems(exc.partial.state_dir), *more]
        raise ConfigError([*exc.problems, *_not_said(more, exc.problems)],
                          exc.partial) from None
    problems = [*state_dir_problems(config.state_dir),
                *sink_option_problems(config.sinks, config.state_dir),
                *lake_dir_problems(config.sinks)]
    try:
        check_host(config)
    except ConfigError as exc:
        problems = [*exc.problems, *problems]
    if problems:
        raise ConfigError(problems, config)
    return config


def bucket_warnings_beside(problems: Sequence[str], sinks: Sequence[SinkConfig]) -> list[str]:
    """What each S3 sink's bucket answers now (store_access.py), for the sinks no problem
    names: a config with an error elsewhere still says its bucket is missing."""
    from aggregator.cli.store_access import s3_access_warnings

    named = {found.group(0) for found in map(_SINK_INDEX.match, problems) if found}
    return [warning for warning in s3_access_warnings(sinks)
            if (found := _SINK_INDEX.match(warning)) is None or found.group(0) not in named]


_SINK_INDEX = re.compile(r"sinks\[\d+\]")


def warnings_beside(problems: Sequence[str], config: AgentConfig | None) -> list[str]:
    """`config_warnings` of a config that also has problems, less those about a key a
    problem already names (a token file that cannot be read is not "no token")."""
    if config is None:
        return []
    keys = {problem.partition(":")[0].split(".")[-1] for problem in problems}
    return [warning for warning in config_warnings(config)
            if not any(key and key in warning for key in keys)]


def state_dir_problems(state_dir: Path) -> list[str]:
    """Whether the agent can write its state_dir (or create it), found by trying as the
    agent would, so a directory it may not write is named before `evagg run` fails."""
    return _unwritable("agent.state_dir", state_dir,
                       "point state_dir (or --state-dir) at a directory it can write")


def lake_dir_problems(sinks: Sequence[SinkConfig]) -> list[str]:
    """The same for each Parquet sink on a local directory: an agent that may not write
    it would keep its events spooled, and retry, until someone reads the log."""
    problems: list[str] = []
    for index, sink in enumerate(sinks):
        if sink.type == "parquet" and not is_s3_url(sink.url):
            problems += _unwritable(
                f"sinks[{index}] ({sink.name}).url", Path(sink.url).expanduser(),
                "point the sink's url at a directory it can write (under systemd, "
                "ProtectSystem=strict lets it write only the state directory, /tmp and "
                "the paths of ReadWritePaths=)")
    return problems


def _unwritable(key: str, directory: Path, remedy: str) -> list[str]:
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"{key}: {directory}: {existing} is not a directory; {remedy}"]
    try:
        handle, probe = tempfile.mkstemp(prefix=".evagg-check-", dir=existing)
    except OSError as exc:
        where = "" if existing == directory else f" (nor create it in {existing})"
        return [f"{key}: the agent cannot write {directory}{where}: {exc.strerror}; make "
                f"it writable by the user that runs evagg ({_user()}), or {remedy}"]
    os.close(handle)
    os.unlink(probe)
    return []


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _names_key(problems: Sequence[str], key: str) -> bool:
    return any(problem.startswith(f"{key}:") or problem.startswith(f"{key} ")
               for problem in problems)


def sink_option_problems(configs: Sequence[SinkConfig], state_dir: Path) -> list[str]:
    """Build each sink as `evagg run` does (it opens nothing until its first write); on a
    refused option, say it and build again without that option."""
    problems: list[str] = []
    for index, config in enumerate(configs):
        options = dict(config.options)
        while True:
            try:
                build_sink(dataclasses.replace(config, options=options), node_id="check",
                           spool_id="check", state_dir=state_dir)
                break
            except (ValueError, OSError) as exc:
                problems.append(sink_problem(index, config, exc))
                key = getattr(exc, "key", None)  # a SinkOptionError names its option
                if key not in options:
                    break
                del options[key]
    return problems


def _sinks_of(path: Path | None) -> tuple[SinkConfig, ...]:
    """The sinks of a config whose other parts are wrong: their problems are known."""
    path = config_path(path)
    try:
        raw = tomllib.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return ()  # load_config said why
    return parse_sinks(raw.get("sinks"), []) if isinstance(raw, dict) else ()


def _not_said(problems: list[str], said: list[str]) -> list[str]:
    keys = {_problem_key(problem) for problem in said}
    return [problem for problem in problems if _problem_key(problem) not in keys]


def _problem_key(problem: str) -> str:
    """`sinks[0].roll_intervall` for `sinks[0] (lake).roll_intervall: ...`: the same key,
    whichever check named it; a sink's own words about its url (`sinks[0] (c): url must
    be ...`) are about `sinks[0].url`."""
    key, _, said = problem.partition(":")
    key = re.sub(r"^(sinks\[\d+\]) \([^)]*\)", r"\1", key)
    if "." not in key and key.startswith("sinks[") and said.strip().startswith("url "):
        key += ".url"
    return key
