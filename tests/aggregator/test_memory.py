"""The agent returns freed memory: Arrow's jemalloc pool unless the operator chose one."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.agentproc import AgentProcess

REPO = Path(__file__).resolve().parents[2]


def _pool_in_log(tmp_path: Path, env: dict[str, str]) -> str:
    agent = AgentProcess(tmp_path, env=env)
    agent.start()
    try:
        line = next(line for line in agent.log().splitlines() if "evagg agent ready" in line)
    finally:
        assert agent.stop() == 0
    return line.rsplit("arrow memory pool ", 1)[1].strip()


def test_agent_uses_jemalloc_when_the_operator_chose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    assert _pool_in_log(tmp_path, {}) == "jemalloc"


def test_an_operators_pool_wins(tmp_path: Path) -> None:
    assert _pool_in_log(tmp_path, {"ARROW_DEFAULT_MEMORY_POOL": "system"}) == "system"


def _child(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True, cwd=REPO)
    return done.stdout.strip()


def test_the_preference_is_set_only_before_pyarrow_loads() -> None:
    before = _child("import os; from aggregator.memory import prefer_returning_pool as p; "
                    "p(); print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    after = _child("import os, pyarrow; from aggregator.memory import prefer_returning_pool "
                   "as p; p(); print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    assert (before, after) == ("jemalloc", "None")


def test_start_up_objects_are_frozen_and_young_collections_are_rare() -> None:
    shown = _child("import gc; from aggregator.memory import calm_garbage_collector as c, "
                   "GC_YOUNG_THRESHOLD as t; c(); "
                   "print(gc.get_freeze_count() > 1000, gc.get_threshold()[0] == t)")
    assert shown == "True True"


def test_pyarrow_does_not_load_pandas_into_the_agent(tmp_path: Path) -> None:
    """pandas is installed here (the test extra); pyarrow would load it on its first
    conversion of Python objects. Events on both decode paths, then the agent's maps."""
    pytest.importorskip("pandas")  # the premise: without pandas there is nothing to keep out
    with AgentProcess(tmp_path) as agent:
        assert agent.proc is not None
        body = b'{"kind": "op", "name": "a"}\n{"kind": "op", "name": "b", "step": "x"}\n'
        request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        agent.wait_delivered(1)
        maps = Path(f"/proc/{agent.proc.pid}/maps").read_text()
    assert "pyarrow" in maps and "/pandas/" not in maps
    shown = _child("import sys; from aggregator.memory import keep_pandas_out as k; k(); "
                   "import pyarrow as pa; pa.array([1, 2]); print('pandas' in sys.modules)")
    assert shown == "False"
