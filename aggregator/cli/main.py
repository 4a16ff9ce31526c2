"""`evagg` command line: one subcommand per job; the work lives in the modules it calls."""
# (The docstring is for developers; DESCRIPTION is what `evagg --help` says to users.)

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.cli.arguments import (
    EvaggParser,
    Parsers,
    parse_naming_the_command,
    subcommands,
)
from aggregator.log_format import FORMATS, configure_logging, log_format_from_environment
from aggregator.memory import keep_pandas_out, prefer_returning_pool

if TYPE_CHECKING:  # imported when used: `evagg query` needs none of the agent's config
    from aggregator.config import AgentConfig, ConfigError

Command = Callable[[argparse.Namespace], int]
DESCRIPTION = """\
evagg collects the events your jobs send on this node (tasks, training steps, ops,
spans), keeps them safe in a spool and writes them to Parquet (or HTTP), where you can
query them.

  evagg run                  start the agent (Ctrl-C stops it)
  evagg run --demo           or see the whole path once, with demo events
  evagg emit --name smoke --state FINISHED --field task_id=t1
  evagg status               is it receiving and delivering?
  evagg query tasks          what the jobs did; evagg dashboard to browse it
"""
EPILOG = "Each command has its own --help, e.g. `evagg query --help`."
DEFERRED_COMMANDS = ("query", "dashboard")  # their parsers import DuckDB: built only when run


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `evagg query ... | head`: the reader has what it wanted
        # Python's own advice: stdout to devnull, so the flush at exit stays quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prefer_returning_pool()  # before anything imports pyarrow
    if argv and argv[0] in DEFERRED_COMMANDS:
        from aggregator.cli.tools import run_deferred

        keep_pandas_out()  # DuckDB imports pandas, where installed, to bind any parameter

        return run_deferred(argv[0], argv[1:])
    parser = build_parser()
    args = parse_naming_the_command(parser, argv)
    if hasattr(args, "log_format"):  # the agent's commands; the others log as text
        try:
            args.log_format = args.log_format or log_format_from_environment()
        except ValueError as exc:
            print(f"evagg: {exc}", file=sys.stderr)
            return 2
    configure_logging(verbose=getattr(args, "verbose", False),
                      log_format=getattr(args, "log_format", "text"))
    command: Command = args.command
    try:
        return command(args)
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = EvaggParser(prog="evagg", description=DESCRIPTION, epilog=EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"evagg {evagg_version()}")
    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(command=usage)
    commands = subcommands(parser, title="commands")
    _add_run(commands)
    _add_check_config(commands)
    _add_client_commands(commands)
    _add_optional_commands(commands)
    return parser


def evagg_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("evagg")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed: a source checkout)"


def _agent_flags(parser: argparse.ArgumentParser) -> None:
    from aggregator.config import DEFAULT_HTTP_LISTEN  # here: `evagg query` never loads it

    parser.add_argument("--config", type=Path, help="TOML file (default: $EVAGG_CONFIG or none)")
    parser.add_argument("--socket", help="Unix socket path (overrides the config)")
    parser.add_argument("--state-dir", help="spool and cursors (overrides the config)")
    parser.add_argument("--http-listen",
                        help=f"host:port of the HTTP port (/metrics, /v1/tail, HTTP ingest; "
                             f"default {DEFAULT_HTTP_LISTEN}), '' to turn it off")
    parser.add_argument("--node-id", help="this node's id (default: host name)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug lines too")
    parser.add_argument("--log-format", choices=FORMATS,
                        help="the agent's log lines: text (default) or json, one object per "
                             "line ($EVAGG_LOG_FORMAT)")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"socket": args.socket, "state_dir": args.state_dir,
            "http_listen": args.http_listen, "node_id": args.node_id}


def load_from_args(args: argparse.Namespace) -> AgentConfig:
    """The config with its flags applied, its sinks built once to check them; ConfigError
    lists every problem found (aggregator/cli/config_check.py)."""
    from aggregator.cli.config_check import load_checked

    return load_checked(args.config, overrides_from_args(args))


def _add_run(commands: Parsers) -> None:
    run = commands.add_parser(
        "run", help="run the agent",
        description="Run the agent in the foreground until Ctrl-C or SIGTERM. The first "
                    "one delivers what is spooled (up to drain_timeout, 60s by default), "
                    "a second one stops at once; what is not delivered stays in the spool "
                    "for the next start.")
    _agent_flags(run)
    run.add_argument("--demo", type=int, nargs="?", const=2000, metavar="EVENTS",
                     help="also run a short demo producer, show the DuckDB query, then exit")
    # Agent on demand (emitters/autostart.py): drain and exit once no process holds a
    # shared flock on PATH. Hidden: drivers pass it, people do not.
    run.add_argument("--exit-when-unused", type=Path, metavar="PATH", help=argparse.SUPPRESS)
    run.set_defaults(command=_run)


def _run(args: argparse.Namespace) -> int:
    from aggregator.config import ConfigError

    try:
        config = load_from_args(args)
    except ConfigError as exc:
        return _print_problems(exc, as_log=args.log_format == "json")
    try:
        if args.demo:
            from aggregator.cli.demo import run_demo

            return run_demo(config, events=args.demo)
        from aggregator.agent import run_agent

        return run_agent(config, exit_when_unused=args.exit_when_unused,
                         overrides=overrides_from_args(args))
    except (OSError, RuntimeError) as exc:  # socket or port taken, spool locked, ...
        problem = f"cannot start the agent: {exc}{_set_by_variables(str(exc), config, args)}"
        if args.demo and _held_by_another_agent(exc):  # the demo's agent, on the defaults
            problem += ("; the demo starts an agent of its own on the defaults: stop the "
                        "running one (Ctrl-C, or `systemctl --user stop evagg-user`), run "
                        "the demo, then start yours again")
        _say(problem, as_log=args.log_format == "json")
        return 1


def _held_by_another_agent(exc: BaseException) -> bool:
    """The spool, the socket or the HTTP port is another agent's (or another program's)."""
    from aggregator.ingest.address_taken import AddressTaken
    from aggregator.spool import SpoolLockedError

    return isinstance(exc, SpoolLockedError | AddressTaken)


def _set_by_variables(problem: str, config: AgentConfig, args: argparse.Namespace) -> str:
    """Which EVAGG_* variable chose the socket, state_dir or HTTP port a start clashed on:
    it wins over the config file, so the file's own value, where a newcomer looks and
    which the message tells them to set, was not the one used."""
    from aggregator.config.agent_config import apply_env

    flags = overrides_from_args(args)
    notes = []
    for key, variable in apply_env({}, os.environ).items():
        value = str(getattr(config, key))
        named = [value, f"{value}/spool"] if key == "state_dir" else [value]  # its spool
        if key in ("socket", "state_dir", "http_listen") and flags.get(key) is None and \
                value and any(_names(problem, one) for one in named):
            notes.append(f"{value} is ${variable}'s, which wins over agent.{key} in a "
                         f"config file: change or unset ${variable}")
        # (a flag wins over both, and is on the command line for all to see)
    return "".join(f"; {note}" for note in notes)


def _names(problem: str, value: str) -> bool:
    """Whether `problem` names `value` whole: a state_dir is not named by a socket path
    inside it, nor port 404 by 4040."""
    return re.search(rf"(?<![\w/.:-]){re.escape(value)}(?![\w/.:-])", problem) is not None


def _add_check_config(commands: Parsers) -> None:
    check = commands.add_parser("check-config", help="validate a config; exit 2 if it is wrong")
    _agent_flags(check)
    check.add_argument("--offline", action="store_true",
                       help="do not try each S3 sink's bucket with the agent's credentials "
                            "(a config checked away from the node)")
    check.set_defaults(command=_check_config)


def _check_config(args: argparse.Namespace) -> int:
    from aggregator.cli.config_check import bucket_warnings_beside, warnings_beside
    from aggregator.config import ConfigError, config_warnings

    as_log = args.log_format == "json"
    try:
        config = load_from_args(args)
    except ConfigError as exc:
        warnings = warnings_beside(exc.problems, exc.partial)  # warnings always
        if exc.partial is not None and not args.offline:
            warnings += bucket_warnings_beside(exc.problems, exc.partial.sinks)
        for warning in warnings:
            _say(f"config warning: {warning}", as_log, logging.WARNING)
        return _print_problems(exc, as_log)
    warnings = config_warnings(config)
    if not args.offline:
        warnings += bucket_warnings_beside([], config.sinks)
    for warning in warnings:
        _say(f"config warning: {warning}", as_log, logging.WARNING)
    print(f"config OK: node {config.node_id}, socket {config.socket}, "
          f"state {config.state_dir}, sinks: {', '.join(s.name for s in config.sinks)}")
    return 0


def _print_problems(exc: ConfigError, as_log: bool = False) -> int:
    for problem in exc.problems:
        _say(f"config error: {problem}", as_log)
    return 2


def _say(message: str, as_log: bool, level: int = logging.ERROR) -> None:
    """A reason the agent stops (or a warning about its config), on stderr: in its log
    format when that is JSON, so a log pipeline parses the line that matters most."""
    if as_log:
        logging.getLogger("evagg").log(level, "%s", message)
    else:
        print(f"evagg: {message}", file=sys.stderr)


def _add_client_commands(commands: Parsers) -> None:
    from aggregator.cli import client as cli_client
    from aggregator.cli import emit as cli_emit

    cli_emit.add_emit_parser(commands)
    cli_client.add_tail_parser(commands)
    cli_client.add_status_parser(commands)


def _add_optional_commands(commands: Parsers) -> None:
    """Commands that live in other packages register their own arguments."""
    from aggregator.cli import tools as cli_tools

    cli_tools.add_tool_parsers(commands)
