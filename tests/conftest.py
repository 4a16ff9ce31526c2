"""Shared fixtures: a real agent subprocess and HTTP endpoints beside it, cleaned up after
each test."""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProcess
from tests.sinks.server_thread import ServerThread

MAX_WORKERS = 8  # each worker may hold a Ray cluster or a JVM: memory, not CPU, bounds more


# The suite's own switches (EVAGG_TEST_CONTAINER, EVAGG_OTHER_DUCKDB, ...), not the agent's.
SUITE_VARIABLES = ("EVAGG_TEST_", "EVAGG_OTHER_")


def pytest_configure(config: pytest.Config) -> None:
    """Each test starts from the same environment, whoever runs the suite: a developer's
    own settings for evagg (EVAGG_HTTP_LISTEN wins over every test agent's config, and
    EVAGG_CONFIG or EVAGG_DATA over the lake a command is given) are dropped, the
    suite's own switches kept; and the query caches of commands that name none go under
    .pytest_cache, not the user's ~/.cache. Tests that want a variable set it themselves."""
    for name in [n for n in os.environ if n.startswith("EVAGG_")
                 and not n.startswith(SUITE_VARIABLES)]:
        del os.environ[name]
    cache = Path(config.rootpath) / ".pytest_cache" / "xdg-cache"
    os.environ["XDG_CACHE_HOME"] = str(cache)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per CPU this process may use (at most MAX_WORKERS). A test
    mostly waits on the peers it started (an agent, Ray, Chromium, Spark): run in one
    process, the suite kept half of one core busy."""
    return min(MAX_WORKERS, 2 * len(os.sched_getaffinity(0)))


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


@pytest.fixture
def servers() -> Iterator[Callable[..., ServerThread]]:
    """`servers(ssl_context=None)`: a started HTTP endpoint (tests/sinks/server_thread.py)."""
    made: list[ServerThread] = []

    def make(ssl_context: ssl.SSLContext | None = None) -> ServerThread:
        made.append(ServerThread(ssl_context).start())
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def exporter_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The OpenTelemetry SDK exporter's log lines, INFO and up (tests/otel_exporter_log.py)."""
    from tests.otel_exporter_log import EXPORTER_LOGGER

    caplog.set_level(logging.INFO, logger=EXPORTER_LOGGER)
    yield caplog
