"""`evagg emit` in a shell script: the command exits as soon as its event is acked, and
that says nothing of the task it reports, so its RUNNING is never ended by the agent."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.agentproc import AgentProcess
from tests.aggregator.liveness.lake import inferred_texts, kill, start_producer, state_of
from tests.waiting import wait_until

GRACE = 'inferred_end_grace = "2s"'
EVAGG = str(Path(sys.executable).with_name("evagg"))


def test_a_running_task_sent_by_evagg_emit_outlives_the_command(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(agent_toml=GRACE).start()
    env = {**os.environ, "EVAGG_SOCKET": str(agent.socket_path)}
    sent = subprocess.run([EVAGG, "emit", "--kind", "task", "--name", "nightly_backup",
                           "--state", "RUNNING", "--field", "task_id=t-shell"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    # A producer killed after it: once its end is inferred, the command's grace is past too.
    control = start_producer(agent, "t-control")
    wait_until(lambda: state_of(agent, "t-control") == "RUNNING", 60, "the control task")
    kill(control)
    wait_until(lambda: state_of(agent, "t-control") == "FAILED", 60,
               lambda: f"the control task FAILED\n{agent.log()}")
    assert state_of(agent, "t-shell") == "RUNNING"
    assert inferred_texts(agent, "task", "task_id", "t-shell") == []
