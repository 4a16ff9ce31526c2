"""Ray resends a body while the first POST of it is still being written (its answer took
over 3 s): the /ray/events handler of a real aiohttp server over a real spool, with the
spool's append held at a gate so the two requests overlap. Whatever the order and the
outcome of the first write, each event lands in the spool once, and Ray never gets a 200
for events that are not in it.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggregator.ingest.http_routes import HttpApi
from aggregator.ingest.ingestor import Ingestor
from aggregator.metrics import AgentMetrics
from aggregator.ray import intake as ray_intake
from aggregator.ray.events import ray_events_to_rows
from aggregator.spool import AppendResult, Spool
from tests.aggregator.ray.samples import generated_events

Answer = tuple[int, dict[str, Any]]


class GatedSpool(Spool):
    """A real spool whose appends wait at a gate while one is set, then fail with EIO
    when `fail` is set (as a disk error would)."""

    gate: asyncio.Event | None = None
    fail = False
    writing = 0

    async def append(self, payload: bytes, count: int, **kwargs: Any) -> AppendResult:
        self.writing += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                raise OSError(errno.EIO, "Input/output error")
            return await super().append(payload, count, **kwargs)
        finally:
            self.writing -= 1


class Served:
    def __init__(self, api: HttpApi, spool: GatedSpool, url: str,
                 session: aiohttp.ClientSession) -> None:
        self.api, self.spool, self.url, self.session = api, spool, url, session

    async def post(self, body: bytes) -> Answer:
        async with self.session.post(f"{self.url}/ray/events", data=body) as answer:
            return answer.status, await answer.json()

    def stored_events(self) -> int:
        return self.spool.counters.appended_events

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait for a state of the server (no clock: the test's timeout bounds it)."""
        while not condition():
            await asyncio.sleep(0.001)

    def waiting(self) -> int:
        """Requests waiting for another request's write."""
        claims = set(self.api.ray.recent_ids._in_flight.values())
        return sum(len(claim.waiters) for claim in claims)


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    metrics = AgentMetrics()
    spool = GatedSpool(tmp_path / "spool", max_bytes=64 * 2**20)
    spool.open()
    ingestor = Ingestor(spool, metrics, node_id="node", host="host")
    api = HttpApi(ingestor, metrics, max_body_bytes=2**26, token=None, is_ready=lambda: True)
    runner = web.AppRunner(api.app(), access_log=None, handle_signals=False,
                           shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            yield Served(api, spool, f"http://127.0.0.1:{port}", session)
    finally:
        await runner.cleanup()
        ingestor.close()
        spool.close()


def run(tmp_path: Path, scenario: Callable[[Served], Awaitable[None]]) -> None:
    async def main() -> None:
        async with served(tmp_path) as server:
            await scenario(server)
    asyncio.run(main())


BODY_EVENTS = generated_events(30)
BODY = json.dumps(BODY_EVENTS).encode()
ROWS = len(ray_events_to_rows(BODY_EVENTS)[0])


async def first_is_writing(server: Served) -> asyncio.Task[Answer]:
    server.spool.gate = asyncio.Event()
    first = asyncio.create_task(server.post(BODY))
    await server.until(lambda: server.spool.writing == 1)
    return first


def test_a_resend_during_a_write_that_succeeds_answers_200_and_stores_nothing(
        tmp_path: Path) -> None:
    async def scenario(server: Served) -> None:
        first = await first_is_writing(server)
        resend = asyncio.create_task(server.post(BODY))
        await server.until(lambda: server.waiting() == 1)
        assert server.spool.gate is not None
        server.spool.gate.set()
        (status, answer), (again, resent) = await first, await resend
        assert (status, answer["accepted"]) == (200, ROWS)
        assert (again, resent["accepted"], resent["rejected"]) == (200, 0, 0)
        assert server.stored_events() == ROWS
        assert server.api.metrics.duplicate_frames.get(route="ray") == len(BODY_EVENTS)
        assert (await server.post(BODY))[1]["accepted"] == 0  # and later resends too
        assert server.stored_events() == ROWS
    run(tmp_path, scenario)


def test_a_resend_during_a_write_that_fails_answers_503_and_the_next_is_stored(
        tmp_path: Path) -> None:
    async def scenario(server: Served) -> None:
        first = await first_is_writing(server)
        resend = asyncio.create_task(server.post(BODY))
        await server.until(lambda: server.waiting() == 1)
        assert server.spool.gate is not None
        server.spool.fail = True
        server.spool.gate.set()
        assert (await first)[0] == 503
        status, answer = await resend
        assert status == 503 and "send again" in answer["error"], answer
        assert server.stored_events() == 0 and server.api.ray.recent_ids.in_flight == 0
        server.spool.fail, server.spool.gate = False, None
        status, answer = await server.post(BODY)  # Ray's next resend
        assert (status, answer["accepted"]) == (200, ROWS)
        assert server.stored_events() == ROWS
    run(tmp_path, scenario)


def test_a_resend_after_the_write_ended_is_stored_or_dropped_by_its_outcome(
        tmp_path: Path) -> None:
    async def scenario(server: Served) -> None:
        server.spool.fail = True
        assert (await server.post(BODY))[0] == 503
        server.spool.fail = False
        assert (await server.post(BODY))[1]["accepted"] == ROWS  # failed first: stored
        assert (await server.post(BODY))[1]["accepted"] == 0  # stored first: dropped
        assert server.stored_events() == ROWS
    run(tmp_path, scenario)


def test_a_resend_that_outwaits_the_first_write_answers_503(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first write is slower than the resend may wait (Ray gives up at 3 s): 503, and
    Ray's next resend after the write is dropped as stored."""
    monkeypatch.setattr(ray_intake, "RAY_RESEND_WAIT_S", 0.01)

    async def scenario(server: Served) -> None:
        first = await first_is_writing(server)
        status, answer = await server.post(BODY)
        assert status == 503 and "send again" in answer["error"], answer
        assert server.spool.gate is not None
        server.spool.gate.set()
        assert (await first)[1]["accepted"] == ROWS
        assert (await server.post(BODY))[1]["accepted"] == 0
        assert server.stored_events() == ROWS
    run(tmp_path, scenario)


def test_a_body_overlapping_a_write_stores_its_own_events_at_once(tmp_path: Path) -> None:
    """Part of a body is new: stored at once; the rest waits for the first write, which
    fails: 503, and Ray's resend stores just that rest."""
    async def scenario(server: Served) -> None:
        first = await first_is_writing(server)
        first_gate, server.spool.gate = server.spool.gate, None  # later appends go through
        extra = generated_events(9)
        body = json.dumps(BODY_EVENTS[:12] + extra).encode()
        mixed = asyncio.create_task(server.post(body))
        await server.until(lambda: server.waiting() == 1)
        own_rows = len(ray_events_to_rows(extra)[0])
        assert server.stored_events() == own_rows
        server.spool.fail = True
        assert first_gate is not None
        first_gate.set()
        assert (await first)[0] == 503
        assert (await mixed)[0] == 503  # 12 of its events were lost with the first write
        server.spool.fail = False
        status, answer = await server.post(body)  # Ray's resend: only those 12 are new
        assert (status, answer["accepted"]) == (200, len(ray_events_to_rows(BODY_EVENTS[:12])[0]))
        assert server.stored_events() == own_rows + answer["accepted"]
    run(tmp_path, scenario)
