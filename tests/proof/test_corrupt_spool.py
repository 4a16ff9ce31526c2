"""A damaged spool at start: a stopped agent's segment gets bytes flipped in its middle.

The agent still comes up, quarantines the damaged original, delivers every intact
record exactly once and nothing of the damaged part, and counts what it lost.
One spool is made per module (producers -> agent, SIGKILLed before any delivery);
each case damages its own copy.
"""

from __future__ import annotations

import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from aggregator.spool._segment import BODY_HEAD, FRAME
from sinks.schema import batch_from_bytes
from tests.agentproc import AgentProcess, query_lake
from tests.producers import producer_report, start_producer
from tests.proof import metric_where, wait_caught_up, wait_until

HOLD_SINK = 'roll_interval = "1h"'  # the file never closes, so nothing is committed
SMALL_SEGMENTS = 'segment_bytes = "2MiB"'


@dataclass(frozen=True)
class Record:
    segment: Path
    position: int  # of its frame header in the file
    length: int  # body length
    offset: int
    task_ids: tuple[str, ...]
    other_events: int  # heartbeats and the like


def sink(roll: str) -> str:
    return f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{{lake}}"\n{roll}\n'


def read_segment(path: Path) -> list[Record]:
    data = path.read_bytes()
    (header_size,) = struct.unpack_from(">H", data, 10)
    records, position = [], header_size
    while position + FRAME.size <= len(data):
        length, _crc = FRAME.unpack_from(data, position)
        body = data[position + FRAME.size: position + FRAME.size + length]
        offset = BODY_HEAD.unpack_from(body)[0]
        batch = batch_from_bytes(body[BODY_HEAD.size:])
        kinds = batch.column("kind").to_pylist()
        ids = tuple(t for k, t in zip(kinds, batch.column("task_id").to_pylist(), strict=True)
                    if k == "task")
        records.append(Record(path, position, length, offset, ids, len(kinds) - len(ids)))
        position += FRAME.size + length
    return records


def segments(state: Path) -> list[Path]:
    return sorted((state / "spool").glob("*.seg"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped agent's state dir: several segments, every record still undelivered."""
    workdir = tmp_path_factory.mktemp("pristine")
    agent = AgentProcess(workdir, sinks_toml=sink(HOLD_SINK), agent_toml='max_frame = "1MiB"',
                         spool_toml=SMALL_SEGMENTS)
    agent.start()
    try:
        procs = [start_producer(agent.socket_path, f"s{n}", 15_000) for n in range(3)]
        assert all(producer_report(proc)["flushed"] for proc in procs)
    finally:
        agent.kill()
    assert len(segments(agent.state_dir)) >= 3
    return agent.state_dir


def middle_task_record(segment: Path) -> tuple[Record, list[Record]]:
    """A record in the middle of the segment holding only task events, and all of them."""
    records = read_segment(segment)
    middle = len(records) // 2
    candidates = [r for r in records[middle:] + records[:middle]
                  if r.task_ids and not r.other_events and r is not records[-1]]
    return candidates[0], records


def flip_payload(record: Record) -> None:
    """Flip bytes inside the payload: the CRC fails, the framing still holds."""
    with record.segment.open("r+b") as f:
        where = record.position + FRAME.size + BODY_HEAD.size + record.length // 3
        f.seek(where)
        chunk = f.read(16)
        f.seek(where)
        f.write(bytes(b ^ 0xFF for b in chunk))


def clobber_length(record: Record) -> None:
    """Garbage in the record's length field: nothing after it frames a record."""
    with record.segment.open("r+b") as f:
        f.seek(record.position)
        f.write(b"\x7f\xee\xdd\xcc")


def clobber_header(segment: Path) -> None:
    with segment.open("r+b") as f:
        f.seek(0)
        f.write(b"NOTASPOOL")


def lost_by_case(case: str, segment: Path) -> tuple[set[str], bool]:
    """Damage the segment per case; returns the task ids damaged, and whether the agent
    can know how many events that was (the record's header is intact)."""
    record, records = middle_task_record(segment)
    if case == "payload bytes flipped":
        flip_payload(record)
        return set(record.task_ids), True
    if case == "record length clobbered":
        clobber_length(record)
        rest = records[records.index(record):]
        return {t for r in rest for t in r.task_ids}, False
    clobber_header(segment)
    return {t for r in records for t in r.task_ids}, False


CASES = ["payload bytes flipped", "record length clobbered", "segment header clobbered"]


@pytest.mark.parametrize("case", CASES)
def test_agent_comes_up_quarantines_the_damage_and_delivers_the_rest(
        pristine: Path, agent_factory: Callable[..., AgentProcess], case: str) -> None:
    agent = agent_factory(sinks_toml=sink('roll_interval = "1s"'),
                          agent_toml='max_frame = "1MiB"', spool_toml=SMALL_SEGMENTS)
    shutil.copytree(pristine, agent.state_dir)
    everything = {t for seg in segments(agent.state_dir) for r in read_segment(seg)
                  for t in r.task_ids}
    assert len(everything) == 45_000
    damaged_segment = segments(agent.state_dir)[1]
    lost, countable = lost_by_case(case, damaged_segment)
    assert lost

    agent.start()  # comes up: recovery never crash-loops on damaged data
    quarantined = list((agent.state_dir / "spool" / "quarantine").glob("*.corrupt"))
    assert [q.name.split(".")[0] for q in quarantined] == [damaged_segment.stem]
    assert re.search(r"spool recovery: truncated 0 bytes, 1 corrupt records", agent.log())
    wait_caught_up(agent, ["lake"], timeout=60)
    if countable:  # the loss reaches the metrics with the next heartbeat
        wait_until(lambda: metric_where(agent, "evagg_dropped_events_total",
                                        reason="corrupt_record") == len(lost),
                   10, lambda: agent.metrics())
    assert agent.stop() == 0

    rows = dict(query_lake(agent.lake_dir, "SELECT task_id, count(*) FROM events "
                                           "WHERE kind = 'task' GROUP BY task_id"))
    assert set(rows) == everything - lost
    assert set(rows.values()) == {1}
    (reported,), = query_lake(agent.lake_dir, "SELECT coalesce(sum(metrics['events']), 0) "
                                              "FROM events WHERE kind = 'loss' "
                                              "AND name = 'corrupt_record'")
    assert reported == (len(lost) if countable else 0)
