"""Deployment proofs: the agent as a whole under faults, full disks, damage, fuzzing,
hostile clients, its units and manifests, and socket activation.

Shared here: an HTTP receiver running in its own thread (tests drive the agent
synchronously), and small readers of the agent's self metrics.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tests.agentproc import AgentProcess
from tests.sinks.flaky_server import FlakyServer
from tests.waiting import wait_until

T = TypeVar("T")
HEARTBEAT_SLACK = 2  # a heartbeat and a loss row not delivered yet


class ThreadedReceiver:
    """A `FlakyServer` (real aiohttp) on its own event loop thread, driven from sync code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FlakyServer()
        self._thread = threading.Thread(target=self.loop.run_forever, name="receiver",
                                        daemon=True)
        self._thread.start()

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(30)

    def _do(self, action: Callable[[], None]) -> None:
        async def run() -> None:
            action()
        self._call(run)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> ThreadedReceiver:
        self._call(self.server.start)
        return self

    def stop(self) -> None:
        """Close the port: the agent's connections are refused until start()."""
        self._call(self.server.stop)

    def answer_always(self, status: int) -> None:
        self._do(lambda: self.server.answer(status, times=None))

    def stall(self, seconds: float) -> None:
        self._do(lambda: self.server.stall(seconds))

    def accepted_events(self) -> list[dict[str, Any]]:
        """Every event of every 2xx-answered request, duplicates included."""
        async def collect() -> list[dict[str, Any]]:
            return [event for seen in self.server.requests if 200 <= seen.status < 300
                    for event in seen.events]
        return self._call(collect)

    def statuses(self) -> list[int]:
        async def collect() -> list[int]:
            return [seen.status for seen in self.server.requests]
        return self._call(collect)

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def http_status(url: str, timeout: float = 5.0) -> int:
    """The status of a GET, or 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def metric_where(agent: AgentProcess, name: str, **labels: str) -> float:
    """Sum of the samples of `name` that carry every given label, in any label order."""
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in agent.metrics().splitlines():
        series, _, value = line.rpartition(" ")
        if (series == name or series.startswith(name + "{")) and all(
                label in series for label in wanted):
            total += float(value)
    return total


def sink_lag(agent: AgentProcess, sink: str) -> float:
    return agent.metric(f'evagg_sink_lag_events{{sink="{sink}"}}')


def wait_caught_up(agent: AgentProcess, sinks: list[str], timeout: float,
                   slack: int = HEARTBEAT_SLACK) -> None:
    """Every sink has delivered all but `slack` spooled events.

    The agent spools a heartbeat every 2 s (tests.agentproc), so a sink's lag rarely
    reads 0; with producers flushed, what is left is heartbeats, which a drain delivers.
    """
    wait_until(lambda: all(sink_lag(agent, sink) <= slack for sink in sinks), timeout,
               lambda: f"sinks {sinks} to catch up:\n{agent.metrics()}", interval=0.2)


def task_ids(events: list[dict[str, Any]]) -> list[str]:
    return [str(event["task_id"]) for event in events if event.get("kind") == "task"]


def expected_ids(counts: dict[str, int]) -> set[str]:
    return {f"{prefix}-{i}" for prefix, count in counts.items() for i in range(count)}
