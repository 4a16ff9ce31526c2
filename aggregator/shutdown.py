"""How the agent stops: the first SIGINT or SIGTERM drains, a second one stops at once.

The first signal starts the drain and logs what it waits for: each sink that still has
events to deliver, where it delivers, how many events, and the drain's deadline; while it
waits, every 10 s, what is left per sink. A second
signal during the drain ends it at once; what is not delivered stays in the spool for the
next start, and the agent exits with 128 + the signal's number (130 for SIGINT, 143 for
SIGTERM), the code a shell gives a process that a signal ended. A drain that runs to its
end (everything delivered, or the deadline reached) exits 0. Either way the last line of
the log says that the agent stopped and what it left spooled.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

from aggregator.delivery.consumer import SinkConsumer
from aggregator.delivery.sink_set import SinkSet
from aggregator.metrics import AgentMetrics
from aggregator.worker_errors import WorkerErrors

log = logging.getLogger("evagg.agent")


class StopSignals:
    """Counts the stop signals: the first asks for a drain, the second for haste."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.second: int | None = None
        self.hurry = asyncio.Event()  # set by the second signal

    def receive(self, signum: int) -> bool:
        """True for the first signal (the caller starts the drain)."""
        if self.first is None:
            self.first = signum
            return True
        if self.second is None:
            self.second = signum
            log.warning("%s again: stopping now, without waiting for the sinks; what they "
                        "have not delivered stays spooled for the next start", _name(signum))
            self.hurry.set()
        return False

    @property
    def exit_code(self) -> int:
        return 128 + self.second if self.second is not None else 0


def log_waiting_for(signum: int, sinks: SinkSet | None, deadline_s: float,
                    socket: Path) -> None:
    """What the drain waits for, said when it starts, so that a quiet wait is not a hang."""
    consumers = _consumers(sinks)
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + deadline_s))
    behind = {name: c for name, c in consumers.items() if c.spool.lag(name)[1]}
    again = "Ctrl-C" if signum == signal.SIGINT else _name(signum)
    if not behind:
        log.info("%s: stopping; the socket %s takes no new events, and every sink has "
                 "delivered what is spooled", _name(signum), socket)
        return
    if deadline_s <= 0:  # drain_timeout = "0s": the operator asked for no wait at all
        log.info("%s: stopping without waiting for the sinks (drain_timeout is 0s); what "
                 "they have not delivered stays spooled for the next start", _name(signum))
        return
    log.info("%s: stopping; delivering what is spooled first, for up to %gs (until %s). "
             "%s again stops at once: what is not delivered stays spooled",
             _name(signum), deadline_s, until, again)
    for name, consumer in behind.items():
        log.info("waiting for sink %s (%s): %s to deliver", name, consumer.sink.describe(),
                 _events(consumer.spool.lag(name)[1]))



async def cancel_until_done(task: asyncio.Task[None], every_s: float = 0.5) -> None:
    """Cancel `task` and wait for it, cancelling again while it runs on: an await that
    swallows one cancellation (Python 3.11's asyncio.wait_for, a library's retry loop)
    must not turn a second Ctrl-C back into the whole drain."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)

DRAIN_PROGRESS_S = 10.0  # a line this often while a drain waits: a long drain is not a hang


async def log_drain_progress(sinks: SinkSet | None, deadline_s: float,
                             metrics: AgentMetrics) -> None:
    """Every DRAIN_PROGRESS_S until the drain ends (the caller cancels this): what is left
    to deliver, per sink, and how long the drain may still wait. A failure here is
    counted and logged once; the drain goes on without these lines."""
    started = time.monotonic()
    try:
        while True:
            await asyncio.sleep(DRAIN_PROGRESS_S)
            left = {name: consumer.spool.lag(name)[1]
                    for name, consumer in _consumers(sinks).items()}
            left = {name: events for name, events in left.items() if events}
            if left:
                waited = time.monotonic() - started
                per_sink = ", ".join(f"sink {name}: {_events(events)}"
                                     for name, events in left.items())
                log.info("still delivering what is spooled (%.0fs of %gs): %s left",
                         waited, deadline_s, per_sink)
    except Exception as exc:
        WorkerErrors(metrics, log).failed("drain_progress", exc, "cannot report the drain's "
                                          "progress; the drain goes on", level=logging.WARNING)


def log_stopped(sinks: SinkSet | None, spool_dir: Path, signals: StopSignals) -> None:
    """The agent's last line: that it stopped, how, and what stays in the spool."""
    consumers = _consumers(sinks)
    how = (f"stopped at once ({_name(signals.second)} during the drain, exit code "
           f"{signals.exit_code})" if signals.second is not None else "stopped")
    left = {name: c.spool.lag(name)[1] for name, c in consumers.items()}
    left = {name: events for name, events in left.items() if events}
    if not left:
        log.info("evagg agent %s: every spooled event was delivered", how)
        return
    per_sink = ", ".join(f"{_events(events)} for sink {name}" for name, events in left.items())
    log.warning("evagg agent %s: events left in the spool %s: %s; the next `evagg run` "
                "with this state_dir delivers them once each sink can (`evagg status` shows "
                "a sink's errors; a sink that stays down needs its url fixed or removed)",
                how, spool_dir, per_sink)


def _consumers(sinks: SinkSet | None) -> dict[str, SinkConsumer]:
    return sinks.consumers if sinks is not None else {}


def _events(count: int) -> str:
    return f"{count} event" if count == 1 else f"{count} events"


def _name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name if signum is not None else "stop"
    except ValueError:
        return f"signal {signum}"
