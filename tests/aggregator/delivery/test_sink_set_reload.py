"""SinkSet.retire, what a reload does to the running sinks: a sink that is down does not
hold the reload for drain_timeout, and a sink that buffers makes its buffer durable."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from aggregator.config.sinks import SinkConfig
from aggregator.delivery.sink_set import SinkSet
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from sinks.base import Sink, SinkResult
from sinks.records import SpoolRecord

EVENTS = 5


class DownSink(Sink):
    """An endpoint that refuses every request."""

    def __init__(self) -> None:
        super().__init__("down")
        self.writes = 0

    async def write(self, records: Sequence[SpoolRecord]) -> SinkResult:
        self.writes += 1
        return SinkResult.failure("connection refused", "connect")

    async def flush(self, *, final: bool = False) -> SinkResult:
        return SinkResult.success()

    async def abandon(self) -> None:
        pass

    async def close(self) -> None:
        pass


class BufferingSink(Sink):
    """Like the Parquet sink: records are durable only when its file is flushed."""

    def __init__(self) -> None:
        super().__init__("buffering")
        self.buffered: list[SpoolRecord] = []
        self.durable: list[int] = []
        self.closed = False

    async def write(self, records: Sequence[SpoolRecord]) -> SinkResult:
        self.buffered += records
        return SinkResult.success()  # buffered: nothing durable yet

    async def flush(self, *, final: bool = False) -> SinkResult:
        if not final or not self.buffered:
            return SinkResult.success()
        last, count = self.buffered[-1].offset, sum(r.count for r in self.buffered)
        self.durable += [r.offset for r in self.buffered]
        self.buffered = []
        return SinkResult.success(last, count)

    async def abandon(self) -> None:
        self.buffered = []

    async def close(self) -> None:
        self.closed = True


def test_a_reload_retires_a_down_sink_at_once_and_flushes_a_buffering_one(
        tmp_path: Path) -> None:
    async def main() -> tuple[DownSink, BufferingSink, Spool, int]:
        spool = Spool(tmp_path / "spool", max_bytes=1 << 24)
        spool.open()
        for i in range(EVENTS):
            await spool.append(b"x" * 100, 1, received_ns=i)
        down, buffering = DownSink(), BufferingSink()
        built: list[tuple[SinkConfig, Sink]] = [
            (SinkConfig("down", "http", "http://127.0.0.1:9/", retry_max_backoff_s=600), down),
            (SinkConfig("buffering", "parquet", str(tmp_path / "lake")), buffering)]
        sinks = SinkSet(spool, AgentMetrics(), built)
        for _ in range(200):  # both have read every record: one failed, one buffered
            if down.writes and len(buffering.buffered) == EVENTS:
                break
            await asyncio.sleep(0.05)
        writes_before = down.writes
        # drain_timeout of ten minutes: stop() would wait it out for the down sink
        await asyncio.wait_for(sinks.retire(600.0), 30)
        return down, buffering, spool, writes_before

    down, buffering, spool, writes_before = asyncio.run(main())
    try:
        assert buffering.durable == list(range(1, EVENTS + 1)) and buffering.closed
        assert spool.lag("buffering") == (0, 0)
        assert down.writes == writes_before  # no retry on the way out
        assert spool.lag("down") == (EVENTS, EVENTS)  # kept for the sink that replaces it
    finally:
        spool.close()
