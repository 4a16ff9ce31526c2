"""The running sinks: one consumer task per configured sink, started and stopped as a set.

Reload builds the new set completely before the old one is touched, so a config whose
sinks cannot be built changes nothing, then retires the old set (each sink makes what it
buffered durable, without delivering its backlog) and starts the new one from the same
cursors; stopping drains every sink at once, within one deadline, and then cancels
whatever is still in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from aggregator.config import ConfigError
from aggregator.config.sinks import SinkConfig
from aggregator.delivery.build import build_sink, sink_problem
from aggregator.delivery.consumer import SinkConsumer
from aggregator.metrics import AgentMetrics
from aggregator.spool import RecordScreen, Spool
from aggregator.worker_errors import WorkerErrors
from sinks.base import Sink

log = logging.getLogger("evagg.sinks")
CANCEL_GRACE_S = 5.0  # after the drain deadline, how long an in-flight write may finish


def build_sinks(configs: Sequence[SinkConfig], *, node_id: str, spool_id: str,
                state_dir: Path) -> list[tuple[SinkConfig, Sink]]:
    """Every sink of the config, or ConfigError naming each one that cannot be built.
    Sinks open no connection or file until their first write, so nothing needs closing."""
    built: list[tuple[SinkConfig, Sink]] = []
    problems: list[str] = []
    for index, config in enumerate(configs):
        try:
            built.append((config, build_sink(config, node_id=node_id, spool_id=spool_id,
                                             state_dir=state_dir)))
        except (ValueError, OSError) as exc:
            problems.append(sink_problem(index, config, exc))
    if problems:
        raise ConfigError(problems)
    return built


class SinkSet:
    def __init__(self, spool: Spool, metrics: AgentMetrics,
                 built: Sequence[tuple[SinkConfig, Sink]],
                 delivered_at_ns: Mapping[str, int] | None = None) -> None:
        """`delivered_at_ns`: when each sink of the set this one replaces last delivered
        (a reload), kept under its name; a new sink starts from now."""
        self.spool = spool
        self.metrics = metrics
        self._errors = WorkerErrors(metrics, log)
        self.consumers: dict[str, SinkConsumer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        spool.register_sinks([config.name for config, _ in built])
        screen = RecordScreen(spool)
        for config, sink in built:
            consumer = SinkConsumer(sink, spool, metrics, read_max_bytes=sink.read_max_bytes,
                                    backoff_cap_s=config.retry_max_backoff_s, screen=screen)
            consumer.state.last_success_ns = (delivered_at_ns or {}).get(sink.name,
                                                                         time.time_ns())
            self.consumers[sink.name] = consumer
            self._tasks.append(asyncio.create_task(consumer.run(), name=f"sink:{sink.name}"))

    def describe(self) -> str:
        return ", ".join(f"{c.name} -> {c.sink.describe()}" for c in self.consumers.values())

    async def stop(self, deadline_s: float) -> None:
        """Deliver what is spooled within the deadline, then stop and close every sink.
        What is not delivered stays in the spool for the next agent."""
        for consumer in self.consumers.values():
            consumer.drain(deadline_s)
        await self._end(deadline_s)

    async def retire(self, deadline_s: float) -> None:
        """Stop every sink for a reload without delivering the backlog first: each makes
        what it has buffered durable once (a failing sink not even that), within the
        deadline. The sinks that replace them start from the same cursors, so a sink
        that is down does not hold the new config back for `drain_timeout`."""
        for consumer in self.consumers.values():
            consumer.finish()
        await self._end(deadline_s)

    async def _end(self, deadline_s: float) -> None:
        """Wait up to the deadline for the consumers to stop on their own, give a write
        still in flight CANCEL_GRACE_S more, cancel the rest, then close every sink."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=deadline_s)
        for consumer in self.consumers.values():
            if consumer.draining and not consumer.caught_up():
                log.warning("sink %s still has %d events to deliver at the deadline; they "
                            "stay spooled", consumer.name, self.spool.lag(consumer.name)[1])
            consumer.stop()
        pending = [task for task in self._tasks if not task.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=CANCEL_GRACE_S)
            for task in still:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for consumer in self.consumers.values():
            try:
                await consumer.close()
            except Exception as exc:  # closing one sink must not keep the others open
                self._errors.failed(f"sink:{consumer.name}", exc, "closing sink %s failed; "
                                    "the other sinks close anyway", consumer.name)
        for name in self.consumers:
            self.metrics.sink_permanent_error.values.pop((("sink", name),), None)
            self.metrics.sink_failing_since.clear(sink=name)
            self.metrics.sink_next_retry.clear(sink=name)

    async def abandon(self, close_timeout_s: float = 2.0) -> None:
        """Stop now, without delivering (a second SIGINT during the drain): cancel what is
        in flight and close the sinks within `close_timeout_s`. Nothing is lost: cursors
        move only past what a sink made durable, so the rest stays spooled."""
        for consumer in self.consumers.values():
            consumer.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        closing = [asyncio.ensure_future(c.close()) for c in self.consumers.values()]
        if closing:
            _, late = await asyncio.wait(closing, timeout=close_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*closing, return_exceptions=True)
