"""The sink contract (sinks/base.py), one test for every sink type: the HTTP sink against a
real aiohttp endpoint, the Parquet sink on a local directory and on moto's S3. Each sink is
built from its [[sinks]] table through the registry, as the agent builds it, and driven as
the delivery loop drives it (write, flush, abandon after a failure, start again from the
cursor).

What every sink owes the loop: it returns a result and never raises, also when its peer
fails between successes; its cursor never moves past what the peer holds and never goes
back; what it sends again after a failure the peer keeps once (the Parquet sink by file
name, the HTTP sink by Idempotency-Key); its counters and gauges are the contract's words;
and `describe()` shows where it delivers without a secret."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sinks.base import Sink, SinkCounter
from sinks.filters import EventFilter
from sinks.records import SpoolRecord
from sinks.registry import sink_types
from sinks.sink_type import SinkPlace
from tests.sinks.http.records import deliver, make_records, record_row
from tests.sinks.moto_server import MotoS3, aws_env
from tests.sinks.server_thread import ServerThread

SECRET = "s3cr3t-contract-token"


@dataclass
class Peer:
    """Where one sink delivers, and how a test reads and breaks it."""

    table: dict[str, Any]  # the [[sinks]] table's type, url and type-specific keys
    kept_event_ids: Callable[[], list[str]]  # what the peer keeps, deduplicated its way
    down: Callable[[], object]
    up: Callable[[], object]


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


def http_peer(web: ServerThread) -> Peer:
    def kept() -> list[str]:  # a collector keeps one 2xx batch per Idempotency-Key
        ids: list[str] = []
        for requests in web.call(_batches(web)).values():
            stored = next((seen for seen in requests if 200 <= seen.status < 300), None)
            ids += [event["event_id"] for event in stored.events] if stored else []
        return ids

    table = {"type": "http", "url": web.url, "batch_interval": "50ms", "timeout": "2s",
             "headers": {"Authorization": f"Bearer {SECRET}"}}
    return Peer(table, kept, web.stop, web.start)


async def _batches(web: ServerThread) -> dict[str, list[Any]]:
    return web.server.batches()


def local_peer(lake: Path) -> Peer:
    parked = lake.with_name("lake-parked")

    def down() -> None:  # the lake's directory is gone and a file stands in its place
        lake.rename(parked)
        lake.write_text("not a directory")

    def up() -> None:
        lake.unlink()
        parked.rename(lake)

    lake.mkdir()
    return Peer({"type": "parquet", "url": str(lake), "roll_interval": "1h"},
                lambda: _ids_of([path.read_bytes() for path in sorted(lake.rglob("*.parquet"))]),
                down, up)


def s3_peer(moto: MotoS3, monkeypatch: pytest.MonkeyPatch) -> Peer:
    for name, value in {**aws_env(), "AWS_SECRET_ACCESS_KEY": SECRET}.items():
        monkeypatch.setenv(name, value)
    bucket = moto.create_bucket()
    client = moto.client(secret_key=SECRET)

    def kept() -> list[str]:
        keys = [key for key in moto.keys(bucket, "lake/") if key.endswith(".parquet")]
        return _ids_of([client.get_object(Bucket=bucket, Key=key)["Body"].read()
                        for key in keys])

    table = {"type": "parquet", "url": f"s3://{bucket}/lake/", "roll_interval": "1h",
             "endpoint_url": moto.endpoint_url, "region": "us-east-1", "path_style": True}
    return Peer(table, kept, moto.stop, moto.start)


def _ids_of(files: list[bytes]) -> list[str]:
    return [i for data in files for i in pq.read_table(io.BytesIO(data),
                                                       columns=["event_id"])["event_id"]
            .to_pylist()]


@pytest.fixture(params=["http", "parquet-local", "parquet-s3"])
def peer(request: pytest.FixtureRequest, tmp_path: Path, servers: Callable[..., ServerThread],
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Peer]:
    if request.param == "http":
        yield http_peer(servers())
    elif request.param == "parquet-local":
        yield local_peer(tmp_path / "lake")
    else:
        moto = request.getfixturevalue("moto")
        found = s3_peer(moto, monkeypatch)
        yield found
        if not moto.running:  # a test that failed in its outage
            moto.start()


def built(peer: Peer, state_dir: Path) -> Sink:
    table = dict(peer.table)
    kind, url = table.pop("type"), table.pop("url")
    place = SinkPlace("contract-node", "contract-spool", state_dir, EventFilter.of((), (), ()),
                      retry_max_backoff_s=1.0)
    return sink_types()[kind].build("contract", url, table, place)


def records(count: int, first_offset: int = 1) -> list[SpoolRecord]:
    """`count` records of 20 events, each event with an id of its own."""
    return make_records(count, 20, first_offset, row=lambda i: {
        **record_row(i), "event_id": f"{first_offset:04d}{i:012x}"})


def ids(batch: list[SpoolRecord]) -> list[str]:
    first = batch[0].offset
    return [f"{first:04d}{i:012x}" for i in range(sum(r.count for r in batch))]


def test_delivers_every_record_once_and_its_cursor_reaches_the_last(
        peer: Peer, tmp_path: Path) -> None:
    sink = built(peer, tmp_path / "state")
    assert sink.sink_type == peer.table["type"]  # the `type` label of its counters
    batch = records(5)
    assert asyncio.run(deliver(sink, batch)) == []
    asyncio.run(sink.close())
    assert sorted(peer.kept_event_ids()) == sorted(ids(batch))


def test_a_peer_down_between_successes_is_a_result_and_nothing_is_kept_twice(
        peer: Peer, tmp_path: Path) -> None:
    sink = built(peer, tmp_path / "state")
    first, second = records(3), records(3, first_offset=4)

    async def scenario() -> None:
        assert await deliver(sink, first) == []
        peer.down()
        try:
            result = await sink.write(second)
            if result.ok:
                result = await sink.flush(final=True)
        finally:
            peer.up()
        assert not result.ok and result.error and result.error_kind  # a result, no raise
        assert result.durable_through is None or result.durable_through <= first[-1].offset
        await sink.abandon()
        assert await deliver(sink, second) == []  # again from the cursor, as the loop does
        await sink.close()

    asyncio.run(scenario())
    kept = peer.kept_event_ids()
    assert sorted(kept) == sorted(ids(first) + ids(second)), "an event lost or kept twice"


def test_its_counters_gauges_and_description_are_the_contracts(
        peer: Peer, tmp_path: Path) -> None:
    sink = built(peer, tmp_path / "state")
    asyncio.run(deliver(sink, records(2)))
    counters = list(sink.counters())
    assert counters and all(isinstance(c, SinkCounter) and c.value >= 0 for c in counters)
    gauges = sink.gauges()
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in gauges.items())
    description = sink.describe()
    assert description and SECRET not in description
    asyncio.run(sink.close())
