"""A long drain is not a silent one: while a real agent waits for a sink that is down,
it says every ten seconds what is left, per sink (docs/operations.md, "Drain and
shutdown")."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable

from tests.agentproc import AgentProcess
from tests.aggregator.stopping import (
    down_collector,
    exit_code,
    make_agent,
    signal_agent,
    spool_events,
    wait_for,
)

PROGRESS = "still delivering what is spooled ("


def test_a_drain_that_waits_logs_what_is_left_per_sink(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = make_agent(agent_factory, down_collector(drain_timeout="60s"))
    spool_events(agent, 12, "collector")
    signal_agent(agent, signal.SIGTERM)
    wait_for(lambda: PROGRESS in agent.log(), "a progress line of the drain", agent,
             timeout=45.0)
    line = next(line for line in agent.log().splitlines() if PROGRESS in line)
    left = re.search(r"s of 60s\): sink collector: (\d+) events? left$", line)
    assert left and int(left.group(1)) >= 12, line  # the agent's heartbeats count too
    signal_agent(agent, signal.SIGTERM)  # a second signal ends the wait
    assert exit_code(agent) == 128 + signal.SIGTERM
