"""Shared fixtures: a real agent subprocess, cleaned up after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProcess


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    made: list[AgentProcess] = []

    def make(**kwargs: Any) -> AgentProcess:
        workdir = tmp_path / f"agent{len(made)}"
        workdir.mkdir()
        agent = AgentProcess(workdir, **kwargs)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        if agent.running:
            agent.kill()


@pytest.fixture
def agent(agent_factory: Callable[..., AgentProcess]) -> AgentProcess:
    """A started agent with one Parquet sink in its workdir."""
    return agent_factory().start()
