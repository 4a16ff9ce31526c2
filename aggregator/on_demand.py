"""The agent on demand (`evagg run --exit-when-unused`, started by `emitters.autostart`):
it stops once no process holds a shared lock on its users file.

Each producer that started or found the agent holds a shared lock on the file while it
runs; the agent polls for an exclusive one. Taken, it is kept until the agent exits, so a
producer that starts meanwhile waits for this agent to go and starts the next one
(docs/agent-on-demand.md).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aggregator.metrics import AgentMetrics
from aggregator.worker_errors import WorkerErrors
from emitters import autostart

log = logging.getLogger("evagg.agent")
UNUSED_POLL_S = 0.5  # how often an agent on demand checks whether any user is left


class UsersWatch:
    def __init__(self, users_path: Path, metrics: AgentMetrics) -> None:
        self.users_path = users_path
        self._errors = WorkerErrors(metrics, log)
        self.claimed_fd: int | None = None  # held until exit once no user is left
        self.checks = metrics.registry.counter(
            "evagg_on_demand_checks_total",
            "Looks by an agent on demand at whether any producer still uses it.")

    async def wait_until_unused(self) -> None:
        """Return once no process uses the agent any more (the lock is then held)."""
        while True:
            await asyncio.sleep(UNUSED_POLL_S)
            try:
                fd = autostart.claim_if_unused(self.users_path)
                self.checks.inc()
            except Exception as exc:  # keep serving; a later poll may succeed
                self._errors.failed("exit_when_unused", exc, "cannot check the users lock %s; "
                                    "the agent keeps serving and looks again", self.users_path)
                continue
            if fd is not None:
                self.claimed_fd = fd
                log.info("no process uses this agent any more (%s): draining", self.users_path)
                return
