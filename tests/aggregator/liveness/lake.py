"""What a user of the lake sees of an agent's inferred ends: `evagg query` against the
agent's Parquet directory, and a producer process that can be killed mid-task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

from tests.agentproc import REPO, AgentProcess
from tests.aggregator.cli.newcomer import evagg

# A producer that sends a task RUNNING (and, unless told "task", an op STARTED), ends
# them when told "finish", says "sent" once the agent acknowledged, then waits.
PRODUCER = textwrap.dedent("""
    import sys, time
    import emitters
    socket, task_id, how = sys.argv[1:4]
    emitters.configure(socket=socket, run_id="run-" + task_id, job_id="job-live")
    emitters.emit(kind="task", name="train", state="RUNNING", task_id=task_id)
    op = emitters.op("epoch-" + task_id, step=3)
    op.__enter__()
    if how == "finish":
        op.__exit__(None, None, None)
        emitters.emit(kind="task", name="train", state="FINISHED", task_id=task_id)
    assert emitters.flush(60), "the agent did not acknowledge"
    print("sent", flush=True)
    if how != "finish":
        time.sleep(3600)
""")


def start_producer(agent: AgentProcess, task_id: str, how: str = "hold"
                   ) -> subprocess.Popen[str]:
    """A producer that sent its task RUNNING and op STARTED (acknowledged) and holds them
    open; with how="finish" it ends both and exits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(agent.socket_path), task_id,
                             how], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "sent\n", f"producer said {line!r} (exit {proc.poll()})"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def tasks(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    """`evagg query --json tasks` by task_id; {} before the lake has a file."""
    if not any(agent.lake_dir.rglob("*.parquet")):
        return {}
    done = evagg("query", "--data", str(agent.lake_dir), "--no-cache", "--json", "tasks",
                 "--limit", "10000")
    assert done.returncode == 0, done.stderr
    return {row["task_id"]: row for row in json.loads(done.stdout)}


def sql(agent: AgentProcess, query: str) -> list[dict[str, Any]]:
    """`evagg query --json sql QUERY`; [] before the lake has a file."""
    if not any(agent.lake_dir.rglob("*.parquet")):
        return []
    done = evagg("query", "--data", str(agent.lake_dir), "--no-cache", "--json", "sql", query)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def state_of(agent: AgentProcess, task_id: str) -> str | None:
    row = tasks(agent).get(task_id)
    return None if row is None else str(row["final_state"])


def inferred_ends(agent: AgentProcess, kind: str, key: str, value: str) -> list[dict[str, Any]]:
    """The stored `kind` events marked evagg_inferred whose `key` is `value`, as `evagg
    query sql` prints them (`said` is the marker)."""
    return sql(agent, f"SELECT state, source, error_type, error_message, attempt, run_id, "
                      f"job_id, attrs['evagg_inferred'] AS said FROM events "
                      f"WHERE kind = '{kind}' AND {key} = '{value}' "
                      "AND attrs['evagg_inferred'] IS NOT NULL")


def inferred_texts(agent: AgentProcess, kind: str, key: str, value: str) -> list[str]:
    """The evagg_inferred marker of every stored `kind` event whose `key` is `value`."""
    return [str(row["said"]) for row in inferred_ends(agent, kind, key, value)]



def failed_task(agent: AgentProcess, task_id: str) -> dict[str, Any] | None:
    """The task's row once it reads FAILED, else None."""
    row = tasks(agent).get(task_id)
    return row if row is not None and row["final_state"] == "FAILED" else None
