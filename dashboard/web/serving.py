"""`evagg dashboard`'s port: served until SIGINT or SIGTERM, with the connection cap and the
header time limit of the agent's own port (sinks/listener.py), so that a local user who
opens connections and holds them cannot take the descriptors DuckDB needs to read the
store (docs/security.md, "Web pages")."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from emitters.ratelimit import RateLimitedLog
from sinks import listener

# A browser sends a request's headers at once, and reopens an idle connection it lost.
HEADER_TIMEOUT_S = 10.0
log = logging.getLogger("evagg.dashboard")
_refusals = RateLimitedLog(log)


def serve_until_stopped(app: web.Application, host: str, port: int,
                        announce: Callable[[], None], *, max_connections: int) -> None:
    """Serve `app` on host:port, at most `max_connections` connections open at once;
    `announce` once the port is open. An OSError (the port in use) is raised before
    anything is served."""
    asyncio.run(_serve(app, host, port, announce, max_connections))


async def _serve(app: web.Application, host: str, port: int,
                 announce: Callable[[], None], max_connections: int) -> None:
    app_runner = listener.runner(app, stall_s=HEADER_TIMEOUT_S)
    await app_runner.setup()

    def refuse_connection() -> None:
        _refusals.log(logging.WARNING, "over_cap", "closing connections beyond %d open at "
                      "once: a local program is holding connections to the dashboard open "
                      "(raise --max-connections if they are yours)", max_connections)

    try:
        server = await listener.serve(app_runner, host, port, max_connections=max_connections,
                                      on_refused=refuse_connection)
        announce()
        await _stop_signal()
        server.close()
    finally:
        await app_runner.cleanup()


async def _stop_signal() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stopped.set)
    await stopped.wait()
