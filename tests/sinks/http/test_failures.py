"""What a user reads when a request got no answer: the operating system's words."""

from __future__ import annotations

import asyncio

import aiohttp

from sinks.http.failures import failure_for_error
from tests.ports import free_port


def test_a_closed_port_reads_connection_refused_not_a_class_name() -> None:
    async def refused() -> aiohttp.ClientError:
        async with aiohttp.ClientSession() as session:
            try:
                await session.post(f"http://127.0.0.1:{free_port()}/v1/events", data=b"{}")
            except aiohttp.ClientError as exc:
                return exc
        raise AssertionError("a closed port answered")

    counter, result = failure_for_error(asyncio.run(refused()), 10.0)
    assert counter == "connect_errors" and result.error_kind == "connect"
    assert result.error == "cannot reach the endpoint: connection refused"
