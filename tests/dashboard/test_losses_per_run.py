"""Which run lost events: a training run's emitter drops events it cannot send, its
`loss` report reaches the lake through a real agent, and `evagg query`'s `losses` view
names the run and job (docs/queries.md, Views)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from emitters import Emitter
from tests.agentproc import AgentProcess

EVAGG = str(Path(sys.executable).with_name("evagg"))


def test_the_losses_view_names_the_run_that_lost_events(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    agent = agent_factory().start()
    emitter = Emitter(socket=agent.socket_path, run_id="exp-44", job_id="train-7",
                      max_frame_bytes=4096)
    try:
        for _ in range(2):
            emitter.emit(kind="task", name="x" * 10_000)  # larger than any frame: too_large
        emitter.emit(kind="task", name="kept", state="FINISHED")
        assert not emitter.flush(30)  # False: not all of them reached the agent
    finally:
        emitter.close(5.0)
    # one report of both drops, or one each: the emitter reports at most once a second
    agent.wait_rows("SELECT sum(metrics['events']) AS lost FROM events WHERE kind = 'loss' "
                    "HAVING lost >= 2", 1)
    done = subprocess.run([EVAGG, "query", "--data", str(agent.lake_dir), "--cache",
                           str(tmp_path / "cache"), "--json", "sql",
                           "SELECT run_id, job_id, reason, sum(events)::INT AS events "
                           "FROM losses GROUP BY ALL"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"run_id": "exp-44", "job_id": "train-7",
                                        "reason": "too_large", "events": 2}]
