"""`evagg query summary` over a lake a real agent wrote: tasks sent without a job id."""

from __future__ import annotations

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
