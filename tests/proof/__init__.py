"""Deployment proofs: the agent as a whole under faults, full disks, damage, fuzzing,
hostile clients, its units and manifests, and socket activation.

Shared here: small readers of the agent's self metrics (the HTTP endpoint beside an
agent is tests/sinks/server_thread.py's).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import Counter
from typing import Any

from tests.agentproc import AgentProcess
from tests.waiting import wait_until

HEARTBEAT_SLACK = 2  # a heartbeat and a loss row not delivered yet


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


def emitter_losses(events: list[dict[str, Any]]) -> Counter[str]:
    """Events the producers' emitters dropped and reported, by run_id: each loss event
    once (the HTTP sink delivers at least once, so a retried batch may bring it twice)."""
    lost: Counter[str] = Counter()
    for e in distinct(events):
        if e.get("kind") == "loss" and (e.get("attrs") or {}).get("component") == "emitter":
            lost[str(e.get("run_id"))] += int(e["metrics"]["events"])
    return lost


def distinct(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({str(e["event_id"]): e for e in events}.values())
