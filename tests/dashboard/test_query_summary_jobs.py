"""`evagg query summary` over a lake a real agent wrote: tasks sent without a job id, and
failures without an error type."""

from __future__ import annotations

import json

import pytest

from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg


def test_tasks_without_a_job_id_are_named_as_such(agent: AgentProcess) -> None:
    sent = evagg("emit", "--socket", str(agent.socket_path), "--name", "lonely",
                 "--state", "FINISHED", "--field", "duration_s=0.2")
    assert sent.returncode == 0, sent.stderr
    agent.stop()
    summary = evagg("query", "--data", str(agent.lake_dir), "--no-cache", "summary")
    assert summary.returncode == 0, summary.stderr
    job_rows = [line.split() for line in summary.stdout.splitlines()
                if line.startswith("job ")]
    assert [row[:5] for row in job_rows] == [["job", "(no", "job", "id)", "1"]]


@pytest.mark.parametrize("cache", [True, False], ids=["task-cache", "no-cache"])
def test_failures_without_an_error_type_add_up_under_the_errors(agent: AgentProcess,
                                                                 cache: bool) -> None:
    """The error rows add up to the failures: a failure sent with only a message counts
    under "(no error type)" instead of vanishing from them."""
    for task_id, extra in [("t1", ["--field", "error_type=ValueError"]),
                           ("t2", ["--field", "error_message=timeout"]), ("t3", [])]:
        sent = evagg("emit", "--socket", str(agent.socket_path), "--name", "step",
                     "--state", "FAILED", "--field", f"task_id={task_id}", *extra)
        assert sent.returncode == 0, sent.stderr
    sent = evagg("emit", "--socket", str(agent.socket_path), "--name", "step",
                 "--state", "FINISHED", "--field", "task_id=t4")
    assert sent.returncode == 0, sent.stderr
    agent.stop()
    where = ["--data", str(agent.lake_dir)] + ([] if cache else ["--no-cache"])
    summary = evagg("query", *where, "summary", "--json")
    assert summary.returncode == 0, summary.stderr
    rows = json.loads(summary.stdout)
    errors = {r["value"]: r["failed"] for r in rows if r["dimension"] == "error_type"}
    assert errors == {"ValueError": 1, "(no error type)": 2}
    failed = next(r["tasks"] for r in rows if r["dimension"] == "state"
                  and r["value"] == "FAILED")
    assert sum(errors.values()) == failed == 3
    # and `tasks` lists those two by the summary's "(none)" for a missing field
    listed = evagg("query", *where, "tasks", "--state", "FAILED", "--error-type", "(none)",
                   "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["task_id"] for r in json.loads(listed.stdout)) == ["t2", "t3"]
    orphans = evagg("query", *where, "tasks", "--job", "(none)", "--json")
    assert len(json.loads(orphans.stdout)) == 4  # none of them was sent with a job id
