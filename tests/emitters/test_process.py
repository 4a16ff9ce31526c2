"""The module-level API in real processes: environment, fork, multiprocessing, exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.emitters.fakeagent import FakeAgent, frame_events, short_socket_path

REPO = Path(__file__).resolve().parents[2]
# Printed by an atexit hook registered before `import emitters`, so it runs after theirs.
STATS_AT_EXIT = """
import atexit, dataclasses, json
def print_stats():
    print("STATS", json.dumps(dataclasses.asdict(__import__("emitters").stats())))
atexit.register(print_stats)
"""


def run_python(code: str, env: dict[str, str] | None = None,
               hang_guard_s: float = 60) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    environment.update(env or {})
    environment["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment,
                          capture_output=True, text=True, timeout=hang_guard_s, check=False)


def exit_stats(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    line = next(l for l in result.stdout.splitlines() if l.startswith("STATS "))
    stats: dict[str, Any] = json.loads(line[len("STATS "):])
    return stats


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(short_socket_path()) as running:
        yield running


def test_module_api_takes_context_from_the_environment(agent: FakeAgent) -> None:
    result = run_python("""
        import emitters
        emitters.emit(kind="task", name="from-env", state="RUNNING")
        with emitters.op("step", step=1) as op:
            op.metric(loss=1.5)
        emitters.configure(run_id="override", attrs={"host_group": "a"})
        emitters.emit(kind="task", name="configured")
        print(emitters.flush(20), emitters.get_emitter().socket_path)
    """, env={"EVAGG_SOCKET": str(agent.path), "EVAGG_JOB_ID": "job-e",
              "EVAGG_RUN_ID": "run-e", "EVAGG_NODE_ID": "node-e"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(agent.path)]
    events = agent.events()
    assert [(e["name"], e.get("state")) for e in events] == [
        ("from-env", "RUNNING"), ("step", "STARTED"), ("step", "FINISHED"), ("configured", None)]
    assert all((e["job_id"], e["node_id"]) == ("job-e", "node-e") for e in events)
    assert [e["run_id"] for e in events] == ["run-e"] * 3 + ["override"]
    assert events[2]["metrics"] == {"loss": 1.5}
    assert events[3]["attrs"] == {"host_group": "a"}


def test_under_torchrun_every_event_says_its_rank(agent: FakeAgent) -> None:
    code = """
        import emitters
        emitters.emit(kind="task", name="loaded")
        emitters.configure(attrs={"team": "vision"})
        with emitters.op("prepare", step=1):
            pass
        print(emitters.flush(20))
    """
    launched = {"EVAGG_SOCKET": str(agent.path), "RANK": "3", "WORLD_SIZE": "4",
                "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "none"}
    result = run_python(code, env=launched)
    assert result.returncode == 0, result.stderr
    rank = {"rank": "3", "world_size": "4"}
    assert [e.get("attrs") for e in agent.events()] == [rank] + [{**rank, "team": "vision"}] * 2
    # RANK alone is any launcher's (or any program's) variable: not taken for torchrun's
    with FakeAgent(short_socket_path()) as other:
        result = run_python(code, env={**{k: v for k, v in launched.items()
                                          if k != "TORCHELASTIC_RUN_ID"},
                                       "EVAGG_SOCKET": str(other.path)})
        assert result.returncode == 0, result.stderr
        assert [e.get("attrs") for e in other.events()] == [None] + [{"team": "vision"}] * 2


def test_module_close_and_stats_act_on_the_default_emitter(agent: FakeAgent) -> None:
    result = run_python(STATS_AT_EXIT + """
import emitters
emitters.emit(kind="task", name="before-close")
print("CLOSED", emitters.close(timeout_s=20))
emitters.emit(kind="task", name="after-close")
print("LATE", emitters.stats().dropped)
""", env={"EVAGG_SOCKET": str(agent.path)})
    assert result.returncode == 0, result.stderr
    assert "CLOSED True" in result.stdout and "LATE {'closed': 1}" in result.stdout
    assert [e["name"] for e in agent.events()] == ["before-close"]
    at_exit = exit_stats(result)  # exit closes it again: nothing changes
    assert (at_exit["emitted"], at_exit["acked"], at_exit["dropped"]) == (2, 1, {"closed": 1})


def test_fork_gives_the_child_a_fresh_emitter(agent: FakeAgent) -> None:
    result = run_python(f"""
        import os, emitters
        emitters.configure(socket={str(agent.path)!r})
        emitters.emit(kind="task", name="parent-before")
        assert emitters.flush(20)
        emitters.emit(kind="task", name="parent-pending")  # queued in the parent at fork time
        pid = os.fork()
        if pid == 0:
            emitters.emit(kind="task", name="child")
            with emitters.op("child-op"):
                pass
            os._exit(0 if emitters.flush(20) else 3)
        emitters.emit(kind="task", name="parent-after")
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), emitters.flush(20))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True"]
    sessions: dict[bytes, list[str]] = defaultdict(list)
    for batch in agent.stored.values():
        for event in frame_events(batch):
            sessions[batch.session].append(event["name"])
    assert sorted(sorted(names) for names in sessions.values()) == [
        ["child", "child-op", "child-op"],
        ["parent-after", "parent-before", "parent-pending"],
    ]
    assert agent.duplicates() == 0


def test_multiprocessing_fork_children_deliver_without_flushing(agent: FakeAgent) -> None:
    result = run_python(f"""
        import multiprocessing, emitters
        emitters.configure(socket={str(agent.path)!r})

        def work(n):
            emitters.emit(kind="task", name=f"worker-{{n}}")  # no flush: os._exit follows

        if __name__ == "__main__":
            emitters.emit(kind="task", name="main")
            context = multiprocessing.get_context("fork")
            workers = [context.Process(target=work, args=(n,)) for n in range(3)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            print([w.exitcode for w in workers], emitters.flush(20))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 0, 0] True"
    names = sorted(e["name"] for e in agent.events())
    assert names == ["main", "worker-0", "worker-1", "worker-2"]
    assert len({b.session for b in agent.stored.values()}) == 4


def test_exit_delivers_what_was_never_flushed(agent: FakeAgent) -> None:
    result = run_python(STATS_AT_EXIT + f"""
import emitters
emitters.configure(socket={str(agent.path)!r}, flush_interval=1.0, exit_timeout=30)
for i in range(100):
    emitters.emit(kind="task", name="at-exit", task_id=str(i))
""")
    assert result.returncode == 0, result.stderr
    assert sorted(int(e["task_id"]) for e in agent.events()) == list(range(100))
    assert exit_stats(result)["acked"] == 100


def test_exit_without_an_agent_gives_up_at_once_and_counts() -> None:
    # A deadline far beyond the hang guard: exit must not wait for it when nobody listens.
    missing = short_socket_path()
    result = run_python(STATS_AT_EXIT + f"""
import emitters
emitters.configure(socket={str(missing)!r}, exit_timeout=600)
for i in range(10):
    emitters.emit(kind="task", name="lost")
""", hang_guard_s=60)
    missing.parent.rmdir()
    assert result.returncode == 0, result.stderr
    assert "10 event(s) not acknowledged" in result.stderr
    assert exit_stats(result)["dropped"] == {"exit_deadline": 10}


def test_exit_with_a_silent_agent_stops_at_the_deadline() -> None:
    with FakeAgent(short_socket_path(), silent_connections=100) as silent:
        result = run_python(STATS_AT_EXIT + f"""
import emitters
emitters.configure(socket={str(silent.path)!r}, exit_timeout=3.0)
emitters.emit(kind="task", name="unacked")
""")
        assert len(silent.received) >= 1
    assert result.returncode == 0, result.stderr
    stats = exit_stats(result)
    assert stats["dropped"] == {"exit_deadline": 1} and stats["sent"] == 1


def test_importing_emitters_sets_up_no_producer_until_first_use(agent: FakeAgent) -> None:
    # The agent, its sinks and the dashboard import emitters' modules: no emitter for them.
    result = run_python("""
        import os
        import emitters, emitters.wire
        import aggregator.agent, dashboard.web.server
        from emitters.emitter import _LIVE
        print("IMPORTED", len(_LIVE), emitters._default is None)
        os.environ["EVAGG_SOCKET"] = os.environ.pop("LATER_SOCKET")  # read at first use
        emitters.emit(kind="task", name="first-use")
        print("USED", len(_LIVE), emitters.flush(20), emitters.get_emitter().socket_path)
    """, env={"LATER_SOCKET": str(agent.path)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == ["IMPORTED 0 True", f"USED 1 True {agent.path}"]
    assert [e["name"] for e in agent.events()] == ["first-use"]
