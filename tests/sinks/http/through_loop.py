"""An HTTP sink driven by the agent's real delivery loop (SinkConsumer over a real Spool),
against a FlakyServer on loopback: what an agent does with a troubled endpoint, in one
process, so a test can watch the sink, the loop and the server at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aggregator.delivery.consumer import SinkConsumer
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from sinks.http import HttpSink
from sinks.records import SpoolRecord
from tests.sinks.flaky_server import FlakyServer, Seen


@dataclass
class LoopRun:
    """A spool with records, one consumer delivering them to `sink`."""

    sink: HttpSink
    spool: Spool
    consumer: SinkConsumer
    metrics: AgentMetrics
    started: float = field(default_factory=time.monotonic)
    limits: list[int] = field(default_factory=list)  # the sink's limit, sampled
    _task: asyncio.Task[None] | None = None
    _sampler: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, sink: HttpSink, records: Sequence[SpoolRecord], tmp: Path,
                    backoff_cap_s: float = 60.0) -> LoopRun:
        spool = Spool(tmp / "spool", max_bytes=1 << 28)
        spool.open()
        spool.register_sinks([sink.name])
        for record in records:
            await spool.append(record.payload, record.count, received_ns=time.time_ns())
        metrics = AgentMetrics()
        consumer = SinkConsumer(sink, spool, metrics, read_max_bytes=sink.read_max_bytes,
                                backoff_cap_s=backoff_cap_s)
        run = cls(sink, spool, consumer, metrics)
        run._task = asyncio.create_task(consumer.run())
        run._sampler = asyncio.create_task(run._sample())
        return run

    async def _sample(self) -> None:
        while True:
            self.limits.append(self.sink.gauges()["concurrency_limit"])
            await asyncio.sleep(0.05)

    def delivered(self) -> bool:
        return self.spool.cursor(self.sink.name) >= self.spool.next_offset

    async def until(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def finish(self, timeout_s: float = 60.0) -> float:
        """Wait until the cursor is past every record; stop; seconds it took."""
        await self.until(self.delivered, timeout_s, "the sink to deliver every record")
        elapsed = time.monotonic() - self.started
        await self.stop()
        return elapsed

    async def stop(self) -> None:
        self.consumer.stop()
        for task in (self._task, self._sampler):
            if task is not None:
                if task is self._sampler:
                    task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.consumer.close()
        self.spool.close()


def serve(test: Callable[[FlakyServer, Path], Awaitable[None]]
          ) -> Callable[[Path], None]:
    """Run an async test with a started FlakyServer and pytest's tmp_path."""
    def wrapper(tmp_path: Path) -> None:
        async def main() -> None:
            server = await FlakyServer().start()
            try:
                await test(server, tmp_path)
            finally:
                await server.stop()

        asyncio.run(main())

    wrapper.__name__ = test.__name__
    wrapper.__doc__ = test.__doc__
    return wrapper


def resent_after_stored(server: FlakyServer) -> list[str]:
    """Keys sent again after the server answered them 2xx (what must never happen)."""
    resent = []
    for key, seen in server.batches().items():
        answered = [s.answered for s in seen if 200 <= s.status < 300]
        if answered and any(s.arrived > min(answered) for s in seen):
            resent.append(key)
    return resent


def first_steps(seen: Sequence[Seen]) -> list[int]:
    return [int(s.events[0]["step"]) for s in seen]
