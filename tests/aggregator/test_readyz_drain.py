"""While the agent drains after SIGTERM, /readyz answers 503; a sink that cannot deliver
within drain_timeout does not hold the exit, and what it had not delivered stays spooled.

The only sink is an HTTP sink whose endpoint (a real aiohttp server) holds every request
without answering, so the drain lasts until drain_timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from emitters import Emitter
from tests.agentproc import REPO, AgentProcess
from tests.ports import free_port
from tests.waiting import wait_until

EVENTS = 50
DRAIN_TIMEOUT = '"8s"'  # long enough for several /readyz answers and an `evagg emit`


class StallingServer:
    """An aiohttp endpoint on its own loop in a thread. While `stalling`, each POST waits
    (until close) and is never answered; otherwise it keeps the events and answers 200."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/ingest"
        self.stalling = True
        self.arrived = threading.Event()  # a request is being held
        self.events: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._release: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/ingest", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.stalling:
            self.arrived.set()
            assert self._release is not None
            await self._release.wait()
            return web.Response(status=503, text="released at close")
        self.events.extend(orjson.loads(line) for line in body.splitlines() if line.strip())
        return web.Response(text="ok")

    async def _stop(self) -> None:
        assert self._release is not None and self._runner is not None
        self._release.set()
        await self._runner.cleanup()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server() -> Iterator[StallingServer]:
    made = StallingServer()
    yield made
    made.close()


def readyz(agent: AgentProcess) -> int:
    try:
        with urllib.request.urlopen(f"{agent.http_url}/readyz", timeout=1) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0  # the port is closed: the drain is over


def emit_tasks(agent: AgentProcess, names: list[str]) -> None:
    emitter = Emitter(socket=str(agent.socket_path), run_id="drain", source="test")
    for name in names:
        emitter.emit(kind="task", name=name, state="FINISHED", duration_s=0.01)
    assert emitter.flush(30.0), "the agent did not acknowledge (spool) the events"
    emitter.close()


def test_readyz_is_503_while_draining_and_undelivered_events_stay_spooled(
        agent_factory: Callable[..., AgentProcess], server: StallingServer) -> None:
    sink = (f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{server.url}"\n'
            'kinds = ["task"]\nbatch_interval = "100ms"\ntimeout = "60s"\n'
            'retry_max_backoff = "1s"\n')
    agent = agent_factory(sinks_toml=sink)
    text = agent.config_path.read_text()
    assert 'drain_timeout = "20s"' in text
    agent.config_path.write_text(text.replace('drain_timeout = "20s"',
                                              f"drain_timeout = {DRAIN_TIMEOUT}"))
    agent.start()
    assert readyz(agent) == 200
    names = [f"task-{i}" for i in range(EVENTS)]
    emit_tasks(agent, names)
    assert server.arrived.wait(30), "the sink never sent its batch"

    proc = agent.proc
    assert proc is not None
    proc.send_signal(signal.SIGTERM)
    statuses: list[int] = []
    during: subprocess.CompletedProcess[str] | None = None
    while proc.poll() is None:
        statuses.append(readyz(agent))
        if statuses[-1] == 503 and during is None:  # a user's `evagg emit` meanwhile
            said = subprocess.run([sys.executable, "-m", "aggregator", "status", "--url",
                                   agent.http_url, "--interval", "0.1"], cwd=REPO,
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            assert said.returncode != 0 or "agent      stopping" in said.stdout, said.stdout
            during = subprocess.run(
                [sys.executable, "-m", "aggregator", "emit", "--socket", str(agent.socket_path),
                 "--name", "during-drain", "--timeout", "1"], cwd=REPO, capture_output=True,
                text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(0.05)
    assert 503 in statuses, statuses  # answered while the process was still draining
    assert during is not None and during.returncode == 1
    assert "the agent there is stopping (draining what it holds)" in during.stderr, during.stderr
    assert 200 not in statuses[statuses.index(503):]
    assert proc.wait(30) == 0
    assert agent.stop() == 0
    assert "sink collector still has" in agent.log() and "stay spooled" in agent.log()
    assert server.events == []  # nothing was acknowledged by the endpoint

    # The next agent on the same spool delivers every event once the endpoint answers.
    server.stalling = False
    agent.start()
    wait_until(lambda: {e.get("name") for e in server.events} >= set(names), 60,
               "the spooled events to be delivered after the restart")
    assert agent.stop() == 0
    delivered = [e for e in server.events if e.get("kind") == "task"]
    assert sorted({e["name"] for e in delivered}) == sorted(names)
