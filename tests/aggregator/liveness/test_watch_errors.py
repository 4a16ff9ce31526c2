"""A liveness watch that cannot read a batch never costs the batch: its events are
stored and acknowledged, the failure is counted in evagg_worker_errors_total and logged
once, and the next batch is watched as usual."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from aggregator.ingest.ingestor import Ingestor
from aggregator.liveness import watch
from aggregator.liveness.facts import BatchFacts
from aggregator.liveness.watch import LivenessWatch
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool


def test_a_batch_the_watch_cannot_read_is_stored_and_the_failure_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real = watch.facts_of
    calls = {"n": 0}

    def first_one_fails(batch: pa.RecordBatch, ops_open: bool = True) -> BatchFacts:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("a bug in reading the batch")
        return real(batch, ops_open)

    monkeypatch.setattr(watch, "facts_of", first_one_fails)

    async def main() -> tuple[int, int, str]:
        metrics = AgentMetrics()
        spool = Spool(tmp_path / "spool", max_bytes=64 * 2**20)
        spool.open()
        ingestor = Ingestor(spool, metrics, node_id="node", host="host")
        ingestor.watcher = LivenessWatch(ingestor, metrics, spool=spool,
                                         state_dir=tmp_path, host="host", grace_s=30)
        try:
            rows = [{"kind": "op", "name": "forward", "state": "FINISHED", "span_id": "s1"}]
            first = await ingestor.ingest_rows(rows, ingestor.stamp(), route="http")
            second = await ingestor.ingest_rows(rows, ingestor.stamp(), route="http")
            return first.accepted + second.accepted, spool.next_offset - spool.first_offset, \
                metrics.registry.render()
        finally:
            ingestor.close()
            spool.close()

    with caplog.at_level(logging.ERROR):
        accepted, records, exposition = asyncio.run(main())
    assert (accepted, records) == (2, 2)
    assert 'evagg_worker_errors_total{type="ValueError",worker="liveness"} 1' in exposition
    assert "only their watching is lost" in caplog.text
