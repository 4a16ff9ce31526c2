"""How a real agent stops: what the first SIGINT or SIGTERM says it waits for, a second
one that ends it at once (130, 143), `drain_timeout = "0s"`, and the line saying it
stopped and what it left spooled."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aggregator.shutdown import cancel_until_done
from tests.agentproc import AgentProcess
from tests.aggregator.stopping import (
    down_collector,
    events_left,
    exit_code,
    first_stop_signal,
    lag,
    make_agent,
    signal_agent,
    spool_events,
    stopped_line,
    wait_for,
)
from tests.producers import producer_report, start_producer


def test_a_first_ctrl_c_says_what_it_waits_for_and_a_second_stops_at_once(
        agent_factory: Callable[..., AgentProcess]) -> None:
    setup = down_collector(drain_timeout="60s")
    agent = make_agent(agent_factory, setup)
    spool_events(agent, 40, "collector")

    log = first_stop_signal(agent, signal.SIGINT)
    waiting = next(line for line in log.splitlines() if "waiting for sink collector" in line)
    assert setup["url"] in waiting and events_left(waiting, "collector") >= 40
    assert "for up to 60s (until " in log and "Ctrl-C again stops at once" in log

    signal_agent(agent, signal.SIGINT)
    assert exit_code(agent) == 130  # 128 + SIGINT: the drain was cut short
    log = agent.log()
    last = stopped_line(log, "evagg agent stopped at once", after="SIGINT again: stopping now")
    assert events_left(last, "collector") >= 40

    # Nothing was lost: the next agent on this state_dir still holds the 40 events.
    agent.start()
    wait_for(lambda: lag(agent, "collector") >= 40,
             "the 40 events still spooled after the restart", agent)
    agent.kill()


def test_a_drain_that_reaches_its_deadline_exits_0_and_says_what_stays_spooled(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = make_agent(agent_factory, down_collector(drain_timeout="1s"))
    spool_events(agent, 25, "collector")
    signal_agent(agent, signal.SIGTERM)
    assert exit_code(agent, timeout=30) == 0
    log = agent.log()
    assert "SIGTERM again stops at once" in log
    last = stopped_line(log, "evagg agent stopped: events left in the spool",
                        after="SIGTERM: stopping; delivering what is spooled first, for up to 1s")
    assert events_left(last, "collector") >= 25 and "the next `evagg run`" in last



def test_a_second_sigterm_stops_at_once_with_exit_143(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """What systemd's or Kubernetes' second TERM (or `kill` typed twice) meets."""
    agent = make_agent(agent_factory, down_collector(drain_timeout="60s"))
    spool_events(agent, 15, "collector")
    assert "SIGTERM again stops at once" in first_stop_signal(agent, signal.SIGTERM)
    signal_agent(agent, signal.SIGTERM)
    assert exit_code(agent) == 143  # 128 + SIGTERM
    last = stopped_line(agent.log(), "evagg agent stopped at once (SIGTERM during the drain, "
                        "exit code 143)", after="SIGTERM again: stopping now")
    assert events_left(last, "collector") >= 15


def test_drain_timeout_0s_exits_0_at_once_and_keeps_the_events_spooled(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """`drain_timeout = "0s"` (docs/configuration.md): do not wait, the spool keeps it."""
    setup = down_collector(drain_timeout="0s")
    agent = make_agent(agent_factory, setup)
    spool_events(agent, 12, "collector")
    signal_agent(agent, signal.SIGTERM)
    assert exit_code(agent) == 0
    log = agent.log()
    assert "waiting for sink" not in log and "for up to" not in log
    last = stopped_line(log, "evagg agent stopped: events left in the spool",
                        after="SIGTERM: stopping without waiting for the sinks (drain_timeout "
                        "is 0s)")
    assert events_left(last, "collector") >= 12
    agent.start()  # the next start still holds them
    wait_for(lambda: lag(agent, "collector") >= 12, "the 12 events after the restart", agent)
    agent.kill()

def test_a_clean_ctrl_c_says_the_agent_stopped_with_nothing_left(agent: AgentProcess) -> None:
    assert producer_report(start_producer(agent.socket_path, "clean", 10))["flushed"]
    agent.wait_delivered(10)
    signal_agent(agent, signal.SIGINT)
    assert exit_code(agent) == 0
    stopped_line(agent.log(), "evagg agent stopped: every spooled event was delivered",
                 after="SIGINT: stopping;")


def test_a_drain_step_that_swallows_a_cancel_still_ends_at_the_second_signal() -> None:
    """Python 3.11's asyncio.wait_for loses a cancellation that comes as its inner await
    finishes; the drain then ran on to its deadline after a second Ctrl-C. A step that
    swallows one cancel is cancelled again until it ends."""
    steps: list[str] = []

    async def stubborn_step() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            steps.append("swallowed the first cancel")  # what the lost cancel looks like
        await asyncio.sleep(60)  # the rest of the drain: only a second cancel ends it
        steps.append("drained to the end")

    async def second_signal() -> bool:
        task = asyncio.create_task(stubborn_step())
        await asyncio.sleep(0)
        await cancel_until_done(task, every_s=0.05)
        return task.cancelled()

    assert asyncio.run(second_signal())
    assert steps == ["swallowed the first cancel"]  # not "drained to the end"
