"""The agent's threads carry their names at the operating system (`top -H`, `ps -L`),
read from /proc as an operator's tools read them, from a real agent that took events."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from aggregator.thread_names import name_this_thread
from tests.agentproc import AgentProcess
from tests.commands import evagg
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="thread names are read from Linux's /proc")


def thread_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return names


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


def test_a_name_is_cut_to_what_linux_keeps_and_never_raises() -> None:
    seen: list[str] = []

    def run() -> None:
        name_this_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=run, name="evagg-a-very-long-thread-name")
    thread.start()
    thread.join()
    assert seen == ["evagg-a-very-lo\n"]
