"""A start refused because another process holds the agent's address.

The Unix socket and the HTTP port raise it when someone already listens there (another
agent, most often), so that `evagg run` can tell that case apart from any other failure
to start by its type, not by its words: `run --demo`, which starts an agent of its own
on the defaults, then says to stop the running one. The spool's own clash is
SpoolLockedError (aggregator/spool)."""

from __future__ import annotations


class AddressTaken(RuntimeError):
    """Another process listens on the socket or the port this agent was to take."""
