"""A spool record whose checksum holds but that no sink can read (aggregator/spool/_screen.py):
every sink gets past it, its bytes are kept in quarantine, and its events are counted as
lost once, by name, across sinks and restarts; end to end through a real agent, the loss
reaches /metrics and the lake as a `loss` event."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from aggregator.config.sinks import SinkConfig
from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.delivery.sink_set import SinkSet
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from aggregator.spool._screen import LOSS_REASON, RecordScreen
from aggregator.spool._state import QUARANTINE_DIR
from sinks.parquet import ParquetSink
from sinks.parquet.options import ParquetOptions
from sinks.parquet.stores import LocalStore
from sinks.schema import batch_to_bytes
from tests.agentproc import AgentProcess

GARBAGE = b"not an arrow record batch, but its checksum holds"


def payload(first: int, count: int) -> bytes:
    rows = [{"kind": "task", "name": "step", "task_id": f"t{first + i}"} for i in range(count)]
    return batch_to_bytes(rows_to_batch(rows, Stamp.now("n1", "h")).batch)


def open_spool(directory: Path) -> Spool:
    spool = Spool(directory, max_bytes=2**30, segment_bytes=2**20)
    spool.open()
    return spool


def append(spool: Spool, data: bytes, count: int) -> None:
    asyncio.run(spool.append(data, count, received_ns=time.time_ns(), session=bytes(16),
                             seq=0))


def lake_task_ids(lake: Path) -> set[str]:
    files = list(lake.rglob("*.parquet"))
    return {t for f in files for t in pq.read_table(f, columns=["task_id"]).column(0).to_pylist()}


async def deliver_all(spool: Spool, lakes: list[Path]) -> SinkSet:
    sinks = [(SinkConfig(f"lake{i}", "parquet", str(lake)),
              ParquetSink(f"lake{i}", LocalStore(lake), ParquetOptions(roll_interval_s=0.2),
                          node_id="n1", spool_id=spool.spool_id))
             for i, lake in enumerate(lakes)]
    sink_set = SinkSet(spool, AgentMetrics(), sinks)
    deadline = time.monotonic() + 30
    while not all(c.caught_up() for c in sink_set.consumers.values()):
        assert time.monotonic() < deadline, "the sinks never got past the bad record"
        await asyncio.sleep(0.05)
    await sink_set.stop(deadline_s=10)
    return sink_set


def test_every_sink_gets_past_an_unreadable_record_and_it_is_counted_once(
        tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    append(spool, payload(0, 10), 10)
    append(spool, GARBAGE, 7)
    append(spool, payload(10, 10), 10)
    lakes = [tmp_path / "lake0", tmp_path / "lake1"]
    asyncio.run(deliver_all(spool, lakes))
    for lake in lakes:
        assert lake_task_ids(lake) == {f"t{i}" for i in range(20)}
    (kept,) = (tmp_path / "spool" / QUARANTINE_DIR).glob("record-*.corrupt")
    assert kept.read_bytes() == GARBAGE and kept.name.startswith("record-00000000000000000002.")
    assert spool.losses.take_unreported() == {LOSS_REASON: 7}  # once, not once per sink
    spool.close()

    again = open_spool(tmp_path / "spool")  # a restart reads it again: no second count
    records = RecordScreen(again).screen(again.read(1))
    assert [r.count for r in records] == [10, 0, 10]
    assert again.losses.take_unreported() == {}
    again.close()


def test_a_batch_of_another_schema_or_cut_short_is_set_aside_too(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    other = pa.record_batch({"x": pa.array([1, 2, 3])})
    append(spool, bytes(other.serialize().to_pybytes()), 3)
    append(spool, payload(0, 5)[:-40], 5)
    records = RecordScreen(spool).screen(spool.read(1))
    assert [r.count for r in records] == [0, 0]
    assert spool.losses.take_unreported() == {LOSS_REASON: 8}
    spool.close()


def test_a_real_agent_reports_the_loss_on_metrics_and_in_the_lake(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path)
    spool = open_spool(agent.state_dir / "spool")  # written before the agent starts
    append(spool, payload(0, 10), 10)
    append(spool, GARBAGE, 4)
    append(spool, payload(10, 10), 10)
    spool.close()
    agent.start()
    try:
        rows = agent.wait_rows("SELECT attrs['reason'], metrics['events'] FROM events "
                               "WHERE kind = 'loss'", 1)
        assert rows == [(LOSS_REASON, 4.0)]
        assert agent.metric(f'evagg_dropped_events_total{{reason="{LOSS_REASON}"}}') == 4
        assert {r[0] for r in agent.query("SELECT task_id FROM events WHERE kind = 'task'")} \
            == {f"t{i}" for i in range(20)}
    finally:
        assert agent.stop() == 0
