"""Parsing the command line so that a wrong flag is reported by the command it was given to.

argparse reports a flag that no sub-command knows with the top-level usage line (`usage:
evagg [-h] {query} ...`), which names neither the command typed nor its options; the
command's own parser says both.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


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
