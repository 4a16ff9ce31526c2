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
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path

from aggregator.config import AgentConfig, ConfigError, check_host, load_config
from aggregator.config.sinks import SinkConfig, parse_sinks
from aggregator.delivery.registry import build_sink, sink_problem


def load_checked(path: Path | None, overrides: dict[str, object]) -> AgentConfig:
    """The config, or ConfigError listing every problem found."""
    try:
        config = load_config(path, overrides=overrides)
    except ConfigError as exc:
        more = sink_option_problems(_sinks_of(path), Path("."))
        raise ConfigError([*exc.problems, *_not_said(more, exc.problems)]) from None
    problems = sink_option_problems(config.sinks, config.state_dir)
    try:
        check_host(config)
    except ConfigError as exc:
        problems = [*exc.problems, *problems]
    if problems:
        raise ConfigError(problems)
    return config


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
    if path is None and os.environ.get("EVAGG_CONFIG"):
        path = Path(os.environ["EVAGG_CONFIG"])
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
    whichever check named it."""
    key = problem.partition(":")[0]
    return re.sub(r"^(sinks\[\d+\]) \([^)]*\)", r"\1", key)
