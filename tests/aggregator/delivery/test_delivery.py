"""SinkConsumer over a real spool: failures are retried from the cursor, and a sink whose
abandon() itself fails does not end delivery."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from aggregator.delivery.consumer import SinkConsumer
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from sinks.base import Sink, SinkResult
from sinks.records import SpoolRecord
from sinks.schema import batch_to_bytes, empty_batch


class FlakySink(Sink):
    """Fails its first `failures` writes; its first abandon() raises like a read-only disk."""

    def __init__(self, failures: int = 2) -> None:
        super().__init__("flaky")
        self.failures = failures
        self.writes = 0
        self.abandons = 0
        self.delivered: list[int] = []

    async def write(self, records: Sequence[SpoolRecord]) -> SinkResult:
        self.writes += 1
        if self.writes <= self.failures:
            return SinkResult.failure("endpoint down", "connect")
        self.delivered += [r.offset for r in records]
        return SinkResult.success(records[-1].offset, sum(r.count for r in records))

    async def flush(self, *, final: bool = False) -> SinkResult:
        return SinkResult.success()

    async def abandon(self) -> None:
        self.abandons += 1
        if self.abandons == 1:
            raise OSError(30, "Read-only file system")

    async def close(self) -> None:
        pass


async def run_until(consumer: SinkConsumer, cursor: int) -> int:
    """Run `consumer` until its sink's cursor reaches `cursor` (10 s at most), stop it,
    and return the cursor it stopped at."""
    task = asyncio.create_task(consumer.run())
    for _ in range(200):
        if consumer.spool.cursor(consumer.name) == cursor:
            break
        await asyncio.sleep(0.05)
    consumer.stop()
    await task
    return consumer.spool.cursor(consumer.name)


def test_delivery_survives_a_failing_abandon_and_resends_from_the_cursor(
        tmp_path: Path) -> None:
    async def main() -> tuple[FlakySink, AgentMetrics, int]:
        spool = Spool(tmp_path / "spool", max_bytes=1 << 24)
        spool.open()
        spool.register_sinks(["flaky"])
        for i in range(5):
            await spool.append(b"x" * 100, 1, received_ns=i)
        metrics = AgentMetrics()
        sink = FlakySink()
        cursor = await run_until(SinkConsumer(sink, spool, metrics, backoff_cap_s=0.05), 6)
        spool.close()
        return sink, metrics, cursor

    sink, metrics, cursor = asyncio.run(main())
    assert cursor == 6 and sink.delivered == [1, 2, 3, 4, 5]
    assert metrics.worker_errors.get(worker="sink:flaky", type="OSError") == 1
    assert metrics.delivery_errors.get(sink="flaky", kind="connect") == 2


class DownSink(FlakySink):
    """Fails its first four writes, then delivers; its abandon() does not fail."""

    def __init__(self) -> None:
        super().__init__(failures=4)

    async def abandon(self) -> None:
        pass


def test_a_sink_that_stays_down_is_said_again_and_its_recovery_says_for_how_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One line per change of failure kind: a sink down for hours said nothing after its
    first, so a window of the log read as healthy in the middle of an outage."""
    import aggregator.delivery.consumer as consumer_module

    monkeypatch.setattr(consumer_module, "STILL_FAILING_EVERY_S", 0.0)  # every failure

    async def main() -> int:
        spool = Spool(tmp_path / "spool", max_bytes=1 << 24)
        spool.open()
        spool.register_sinks(["flaky"])
        for i in range(3):  # readable records, so none is set aside as unreadable
            await spool.append(batch_to_bytes(empty_batch()), 1, received_ns=i)
        cursor = await run_until(
            SinkConsumer(DownSink(), spool, AgentMetrics(), backoff_cap_s=0.02), 4)
        spool.close()
        return cursor

    with caplog.at_level(logging.INFO, logger="evagg.delivery"):
        assert asyncio.run(main()) == 4
    said = [r.getMessage() for r in caplog.records]
    assert sum("sink flaky failed (connect)" in line for line in said) == 1
    still = [line for line in said if "sink flaky still failing (connect) since" in line]
    assert len(still) == 3 and "3 events waiting" in still[0], said
    recovered = next(line for line in said if "recovered after 4 failed attempts over" in line)
    assert recovered.endswith("0 events to catch up"), recovered  # one write took them all
