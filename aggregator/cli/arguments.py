"""Parsing the command line so that a wrong flag is reported by the command it was given to.

argparse reports a flag that no sub-command knows with the top-level usage line (`usage:
evagg [-h] {query} ...`), which names neither the command typed nor its options; the
command's own parser says both. A mistyped command or choice is answered with the
nearest one (`evagg querry` -> did you mean 'query'?), as Python 3.14's argparse can
(`suggest_on_error`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, NoReturn, TypeAlias, cast

Parsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)'")


class EvaggParser(argparse.ArgumentParser):
    """argparse's parser, whose error for a value that is not one of the choices names
    the nearest choice. Sub-command parsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.search(message)
        if found:
            import difflib  # only on this error path

            # this parser's choices: its sub-commands' names, or a flag's values
            choices = [str(choice) for action in self._actions if action.choices is not None
                       for choice in action.choices]
            near = difflib.get_close_matches(found.group(1), choices, n=1)
            if near:
                message += f"; did you mean {near[0]!r}?"
        super().error(message)


def subcommands(parser: EvaggParser, **options: Any) -> Parsers:
    """`parser.add_subparsers(**options)`: its sub-commands are EvaggParsers too."""
    return cast(Parsers, parser.add_subparsers(**options))


def parse_naming_the_command(parser: argparse.ArgumentParser,
                             argv: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but unknown arguments are an error of the innermost
    sub-command named in `argv` (exit 2 with its usage)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        innermost(parser, argv).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def innermost(parser: argparse.ArgumentParser,
              argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the deepest sub-command that `argv` names (`evagg query tasks`)."""
    current = parser
    for token in argv:
        commands = next((action for action in current._actions
                         if isinstance(action, argparse._SubParsersAction)), None)
        if commands is None or token not in commands.choices:
            continue
        current = commands.choices[token]
    return current
