"""A loopback HTTP port that local users cannot run out of file descriptors: a cap on the
connections it holds open, and a time limit on a request's headers.

Both HTTP servers of evagg use it: the agent's port and `evagg dashboard`. It lives in
`sinks/`, the lowest floor with aiohttp that both may import (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

# What a browser says of the page that caused a request (Sec-Fetch-Site): another site's
# (cross-site), or one of another port or name of this machine (same-site: a site ignores
# ports). Its own pages say same-origin; an address typed or bookmarked says none. Other
# clients send no such header. A page may fire GETs anywhere (an <img src>, a form) with
# no CORS to ask, and each may cost a query.
OTHER_SITES = ("cross-site", "same-site")


def from_another_site(headers: Mapping[str, str]) -> str:
    """Sec-Fetch-Site's value where a page of another site (or port) caused the request,
    else ""."""
    site = headers.get("Sec-Fetch-Site", "").strip().lower()
    return site if site in OTHER_SITES else ""


def runner(app: web.Application, *, stall_s: float, **options: Any) -> web.AppRunner:
    """An AppRunner whose connections must send a request's headers within `stall_s` of
    opening (or of their last answer), else they are closed (aiohttp's keep-alive timer,
    which also runs before the first request); the rest of a refused body is waited for
    that long at most (lingering). aiohttp's own defaults hold an idle connection 75 s."""
    return web.AppRunner(app, access_log=None, handle_signals=False,
                         keepalive_timeout=stall_s, lingering_time=stall_s, **options)


async def serve(app_runner: web.AppRunner, host: str, port: int, *, max_connections: int,
                on_refused: Callable[[], None]) -> asyncio.Server:
    """Listen on host:port with at most `max_connections` connections open: one more is
    closed at once (on_refused is told), so that clients which open connections and hold
    them (a slow request never finished) cannot take the file descriptors the rest of the
    process needs. The caller closes the server before app_runner.cleanup()."""
    server = app_runner.server
    assert server is not None, "app_runner.setup() first"

    def connection() -> asyncio.BaseProtocol:
        if len(server.connections) >= max_connections:
            on_refused()
            return _Refused()
        return server()

    return await asyncio.get_running_loop().create_server(connection, host, port)


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
