"""What a user reads when a request got no answer: the operating system's words, a host
that does not resolve named as such, and a TLS handshake with a plain HTTP endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from sinks.http.failures import failure_for_error
from tests.ports import free_port
from tests.sinks.server_thread import ServerThread


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


async def _error_posting(url: str) -> aiohttp.ClientError:
    async with aiohttp.ClientSession() as session:
        try:
            await session.post(url, data=b"{}")
        except aiohttp.ClientError as exc:
            return exc
    raise AssertionError(f"{url} answered")


def test_a_host_that_does_not_resolve_says_so() -> None:
    # .invalid never resolves (RFC 2606); the resolver's code read "unknown error -2"
    counter, result = failure_for_error(
        asyncio.run(_error_posting("http://collector.invalid/ingest")), 10.0)
    assert counter == "connect_errors" and result.error_kind == "connect"
    assert result.error is not None
    assert result.error.startswith("cannot reach the endpoint: collector.invalid does not "
                                   "resolve (DNS: "), result.error
    assert "unknown error" not in result.error.lower()


def test_https_to_a_plain_http_endpoint_says_to_try_http(
        servers: Callable[..., ServerThread]) -> None:
    plain = servers()  # answers plain HTTP on its port
    counter, result = failure_for_error(
        asyncio.run(_error_posting(plain.url.replace("http://", "https://"))), 10.0)
    assert counter == "tls_errors" and result.permanent
    assert result.error == ("TLS handshake failed: WRONG_VERSION_NUMBER; the endpoint may "
                            "speak plain HTTP: try http://")


def test_a_reset_after_the_request_is_not_called_unreachable(
        servers: Callable[..., ServerThread]) -> None:
    # The endpoint took the connection and the body, then dropped it: the network and DNS
    # are fine, so "cannot reach the endpoint" would send the on-call the wrong way.
    endpoint = servers()
    endpoint.do(lambda: endpoint.server.reset_after_store(1))
    async def reset() -> aiohttp.ClientError:
        async with aiohttp.ClientSession() as session:
            try:
                await session.post(endpoint.url, data=b'{"kind": "op"}\n',
                                   headers={"Content-Type": "application/x-ndjson"})
            except aiohttp.ClientError as exc:
                return exc
        raise AssertionError("the endpoint answered")

    counter, result = failure_for_error(asyncio.run(reset()), 10.0)
    assert counter == "connect_errors" and result.error_kind == "connect"
    assert result.error is not None
    assert result.error.startswith("the connection broke before an answer: "), result.error
