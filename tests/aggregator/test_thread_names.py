"""The agent's threads carry their names at the operating system (`top -H`, `ps -L`),
read from /proc as an operator's tools read them, from a real agent that took events."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.agentproc import AgentProcess
from tests.commands import evagg
from tests.threads import thread_names
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="thread names are read from Linux's /proc")


def test_an_agent_s_threads_say_what_they_do(tmp_path: Path) -> None:
    with AgentProcess(tmp_path) as agent:
        assert agent.proc is not None
        sent = evagg("emit", "--socket", str(agent.socket_path), "--kind", "task",
                     "--name", "named", "--state", "FINISHED")
        assert sent.returncode == 0, sent.stderr
        agent.wait_delivered(1)  # decoded, and written to Parquet by the loop's pool

        def named() -> list[str] | None:
            names = thread_names(agent.proc.pid)  # type: ignore[union-attr]
            wanted = ("evagg-decode_", "evagg-worker_")
            return names if all(any(n.startswith(w) for n in names) for w in wanted) else None
        wait_for(named, 30, "the decode and worker threads under their names", interval=0.2)
