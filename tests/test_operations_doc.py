"""docs/operations.md's retention script, run as printed (only the lake's path changed)
over a lake a real agent wrote and `evagg compact` merged: a day past the cutoff goes
whole, its task fragments with it, and what is kept answers as before."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from tests.agentproc import REPO, AgentProcess
from tests.aggregator.cli.newcomer import evagg

DOC_ROOT = "/var/lib/evagg/parquet"
OLD_DAY = "date=2020-01-01"


def retention_script() -> str:
    section = (REPO / "docs" / "operations.md").read_text().split(
        "\n## Disk: the spool is capped, a local Parquet directory is not\n", 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert found, "docs/operations.md: the Disk section has no sh block"
    return found.group(1)


def summary_tasks(lake: Path) -> int:
    done = evagg("query", "--data", str(lake), "--no-cache", "summary", "--json")
    assert done.returncode == 0, done.stderr
    return int(next(r["tasks"] for r in json.loads(done.stdout) if r["dimension"] == "all"))


def test_the_retention_script_removes_an_old_day_with_its_task_fragments(
        agent: AgentProcess, tmp_path: Path) -> None:
    for i in range(20):
        sent = evagg("emit", "--socket", str(agent.socket_path), "--name", "kept",
                     "--state", "FINISHED", "--field", f"task_id=k{i}", "--field",
                     "duration_s=0.1")
        assert sent.returncode == 0, sent.stderr
    assert agent.stop() == 0
    lake = agent.lake_dir
    merged = evagg("compact", str(lake), "--grace", "0", timeout=120)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    today = next(lake.glob("date=*")).name
    assert (lake / "_tasks" / today).is_dir(), "compact wrote no task fragment"
    # An old day as the agents leave one: its events and its hours' fragments.
    shutil.copytree(lake / today, lake / OLD_DAY)
    shutil.copytree(lake / "_tasks" / today, lake / "_tasks" / OLD_DAY)
    before = summary_tasks(lake)

    script = tmp_path / "retention.sh"
    script.write_text(retention_script().replace(DOC_ROOT, str(lake)))
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    assert not (lake / OLD_DAY).exists() and not (lake / "_tasks" / OLD_DAY).exists()
    assert (lake / today).is_dir() and (lake / "_tasks" / today).is_dir()
    assert summary_tasks(lake) == before == 20
