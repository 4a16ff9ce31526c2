"""Ray eventIds read back from a real spool at start (aggregator/ray/recall.py): exactly
the Ray events' ids, as Ray sent them, oldest first; other sources, records of socket
sessions and ids that are not Ray's are skipped; reading stops at the window or at the
byte budget, which every record read counts against, keeping the newest; a record that
cannot be read is skipped and counted, and the rest still counts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.ray.batch import ray_items_to_batch
from aggregator.ray.dedupe import ray_event_id
from aggregator.ray.recall import ray_ids_of, recall_ray_ids
from aggregator.spool import Spool
from sinks.schema import batch_to_bytes
from tests.aggregator.ray.samples import generated_events

STAMP = Stamp.now("node-a", "host-a")


def ray_payload(items: list[dict[str, Any]]) -> bytes:
    mapped = ray_items_to_batch(list(enumerate(items)), STAMP)
    assert mapped.normalized.rejected == []
    return batch_to_bytes(mapped.batch)


def native_payload(event_ids: list[str], source: str = "torch") -> bytes:
    rows = [{"kind": "op", "event_id": e, "source": source, "name": "step"} for e in event_ids]
    return batch_to_bytes(rows_to_batch(rows, STAMP).batch)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    opened = Spool(tmp_path / "spool", max_bytes=2**30, segment_bytes=2**20)
    opened.open()
    return opened


def append(spool: Spool, payload: bytes, session: bytes = bytes(16), seq: int = 0) -> None:
    asyncio.run(spool.append(payload, 1, received_ns=1, session=session, seq=seq))


def test_every_ray_event_id_comes_back_as_ray_sent_it(spool: Spool) -> None:
    first, second = generated_events(30), generated_events(30)
    append(spool, ray_payload(first))
    append(spool, native_payload(["a" * 32, "bb"]))  # hex-looking ids of another source
    append(spool, ray_payload(second))
    recalled = recall_ray_ids(spool, want=10_000)
    assert recalled.ids == [e["eventId"] for e in first + second]
    assert recalled.unreadable == 0
    spool.close()


def test_records_of_socket_sessions_are_not_read(spool: Spool) -> None:
    items = generated_events(9)
    append(spool, ray_payload(items), session=b"s" * 16, seq=1)  # not an HTTP route's
    assert recall_ray_ids(spool, want=10_000).ids == []
    spool.close()


def test_reading_stops_at_the_window_keeping_the_newest(spool: Spool) -> None:
    batches = [generated_events(30) for _ in range(200)]  # over one 64-record step
    for items in batches:
        append(spool, ray_payload(items))
    newest = [e["eventId"] for items in batches[-3:] for e in items]
    assert recall_ray_ids(spool, want=len(newest)).ids == newest
    assert recall_ray_ids(spool, want=1, max_bytes=1).ids == [e["eventId"] for e in batches[-1]]
    assert len(recall_ray_ids(spool, want=10**9, max_bytes=2**40).ids) == 200 * 30
    spool.close()


def test_records_of_other_routes_count_against_the_byte_budget(spool: Spool) -> None:
    older = generated_events(30)
    append(spool, ray_payload(older))
    socket_record = ray_payload(generated_events(30))  # the size of a Ray record
    for seq in range(1, 21):
        append(spool, socket_record, session=b"s" * 16, seq=seq)
    budget = 10 * len(socket_record)
    assert recall_ray_ids(spool, want=10_000, max_bytes=budget).ids == []  # never reached
    assert recall_ray_ids(spool, want=10_000, max_records=20).ids == []  # nor by count
    assert len(recall_ray_ids(spool, want=10_000, max_records=21).ids) == 30
    found = recall_ray_ids(spool, want=10_000, max_bytes=100 * len(socket_record))
    assert found.ids == [e["eventId"] for e in older]
    spool.close()


def test_an_unreadable_record_is_skipped_and_counted(spool: Spool) -> None:
    older, newer = generated_events(30), generated_events(30)
    append(spool, ray_payload(older))
    append(spool, b"not an arrow record batch")
    append(spool, ray_payload(newer))
    recalled = recall_ray_ids(spool, want=10_000)
    assert recalled.ids == [e["eventId"] for e in older + newer]
    assert recalled.unreadable == 1
    spool.close()


def test_an_event_id_kept_as_sent_comes_back_as_sent(spool: Spool) -> None:
    items = generated_events(3)
    items[1]["eventId"] = "not-base64-id"  # stored under a digest, kept in attrs
    append(spool, ray_payload(items))
    assert recall_ray_ids(spool, want=10_000).ids == [e["eventId"] for e in items]
    spool.close()


def test_an_event_id_that_is_not_a_string_comes_back_as_its_dedupe_key(spool: Spool
                                                                        ) -> None:
    """A resend that straddles a restart is caught only if the recall rebuilds the key
    the ingest deduped the event by."""
    items = generated_events(3)
    items[0]["eventId"], items[2]["eventId"] = 5, ["a", 1]
    append(spool, ray_payload(items))
    assert recall_ray_ids(spool, want=10_000).ids == [ray_event_id(e) for e in items]
    assert recall_ray_ids(spool, want=10_000).ids[::2] == ["5", '["a",1]']
    spool.close()


def test_ids_of_several_rows_and_ids_that_are_not_ray_s() -> None:
    items = generated_events(6)
    lifecycle = [e for e in items if "taskLifecycleEvent" in e]
    assert any(len(e["taskLifecycleEvent"]["stateTransitions"]) > 1 for e in lifecycle)
    assert ray_ids_of(ray_payload(items)) == [e["eventId"] for e in items]  # each once
    assert ray_ids_of(native_payload(["not-hex", "abc-1"], source="ray")) == []
