"""The HTTP port's listening socket, with a cap on the connections it holds open."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web


async def serve(runner: web.AppRunner, host: str, port: int, *, max_connections: int,
                on_refused: Callable[[], None]) -> asyncio.Server:
    """Listen on host:port with at most `max_connections` connections open: one more is
    closed at once (on_refused is told), so that clients which open connections and hold
    them (a slow request never finished) cannot take the file descriptors the socket,
    the spool and the sinks need. The caller closes the server before runner.cleanup()."""
    server = runner.server
    assert server is not None, "runner.setup() first"

    def connection() -> asyncio.BaseProtocol:
        if len(server.connections) >= max_connections:
            on_refused()
            return _Refused()
        return server()

    return await asyncio.get_running_loop().create_server(connection, host, port)


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
