"""Every flag of every `evagg` command says in its --help what it does: a newcomer reads
`evagg query tasks --help`, not the source."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from aggregator.cli.main import build_parser
from aggregator.cli.query_ddl import add_ddl_parser
from dashboard.cli.query import add_query_parser, default_data
from dashboard.web.server import add_dashboard_parser


def deferred_parser() -> argparse.ArgumentParser:
    """`evagg query` and `evagg dashboard`, built as aggregator/cli/tools.py builds them."""
    parser = argparse.ArgumentParser(prog="evagg")
    commands = parser.add_subparsers()
    add_ddl_parser(add_query_parser(commands), default_data)
    add_dashboard_parser(commands)
    return parser


def commands(parser: argparse.ArgumentParser, path: str = "evagg"
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def test_every_flag_of_every_command_has_help() -> None:
    silent = [f"{path} {'/'.join(action.option_strings) or action.dest}"
              for parser in (build_parser(), deferred_parser())
              for path, command in commands(parser)
              for action in command._actions
              if not isinstance(action, argparse._SubParsersAction)
              and action.help is None and action.option_strings]
    assert silent == []
