"""A real agent stopped as an operator stops it, for the stop and drain tests: an HTTP sink
whose endpoint is down (so the drain has something to wait for), signals, the exit code,
and the lines the agent says as it stops (aggregator/shutdown.py)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable

from tests.agentproc import AgentProcess
from tests.ports import free_port
from tests.producers import producer_report, start_producer


def down_collector(drain_timeout: str = "20s") -> dict[str, str]:
    """An HTTP sink pointed at a loopback port where nothing listens."""
    url = f"http://127.0.0.1:{free_port()}/ingest"
    return {"sinks_toml": f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{url}"\n',
            "url": url, "drain_timeout": drain_timeout}


def make_agent(agent_factory: Callable[..., AgentProcess], setup: dict[str, str]) -> AgentProcess:
    agent = agent_factory(sinks_toml=setup["sinks_toml"])
    config = agent.config_path.read_text()  # agentproc writes drain_timeout = "20s"
    agent.config_path.write_text(config.replace('drain_timeout = "20s"',
                                                f'drain_timeout = "{setup["drain_timeout"]}"'))
    return agent.start()


def spool_events(agent: AgentProcess, count: int, sink: str) -> None:
    assert producer_report(start_producer(agent.socket_path, "stop", count))["flushed"]
    wait_for(lambda: lag(agent, sink) >= count, f"{count} events spooled for {sink}", agent)


def lag(agent: AgentProcess, sink: str) -> float:
    return agent.metric(f'evagg_sink_lag_events{{sink="{sink}"}}')


def events_left(line: str, sink: str) -> int:
    """The count a log line gives for `sink` (the agent's own heartbeats are events too)."""
    found = re.search(rf"(\d+) events? (?:to deliver|for sink {sink})", line)
    assert found, line
    return int(found.group(1))


def wait_for(condition: Callable[[], bool], what: str, agent: AgentProcess,
             timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not seen within {timeout}s: {what}\n{agent.log()}")


def signal_agent(agent: AgentProcess, signum: int) -> None:
    assert agent.proc is not None
    agent.proc.send_signal(signum)


def exit_code(agent: AgentProcess, timeout: float = 15.0) -> int:
    assert agent.proc is not None
    try:
        code = agent.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the agent did not exit within {timeout}s:\n{agent.log()}") from None
    agent.proc = None
    return code


def stopped_line(log: str, stopped: str, after: str) -> str:
    """The one line saying `stopped`, checked to come after the line saying `after`. It need
    not be the last line: what the interpreter writes as it exits may follow it."""
    lines = log.splitlines()
    said = [i for i, line in enumerate(lines) if stopped in line]
    assert len(said) == 1, f"{len(said)} lines say {stopped!r}:\n{log}"
    earlier = [i for i, line in enumerate(lines) if after in line]
    assert earlier and earlier[0] < said[0], f"{stopped!r} is not after {after!r}:\n{log}"
    return lines[said[0]]


def first_stop_signal(agent: AgentProcess, signum: int, sink: str = "collector") -> str:
    """The first SIGINT or SIGTERM, then the line that says what the drain waits for
    for `sink`; returns the log up to there."""
    signal_agent(agent, signum)
    wait_for(lambda: f"waiting for sink {sink}" in agent.log(), "the waiting line", agent)
    return agent.log()
