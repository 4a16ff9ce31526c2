"""The `evagg` command: the agent's front door and the clients of every other command."""

from aggregator.cli.main import main

__all__ = ["main"]
