"""The agent's loopback HTTP port: the routes' aiohttp runner on the listener both of
evagg's ports share (sinks/listener.py: a connection cap and a time limit on headers), and
what the agent says when the port cannot be opened.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

from aiohttp import web

from aggregator.decode import otlp
from aggregator.ingest.address_taken import AddressTaken
from aggregator.ingest.http_routes import HttpApi
from aggregator.ingest.wrong_protocol import ServerLog
from aggregator.metrics import AgentMetrics
from emitters.ratelimit import RateLimitedLog
from sinks import listener

log = logging.getLogger("evagg.agent")


class HttpPort:
    def __init__(self, api: HttpApi, metrics: AgentMetrics, *, listen: str, stall_s: float,
                 max_connections: int) -> None:
        self.api = api
        self.metrics = metrics
        self.listen = listen  # host:port; "" runs without the port
        self.stall_s = stall_s
        self.max_connections = max_connections
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._log = RateLimitedLog(log)
        self._server_log: ServerLog | None = None

    async def open(self) -> None:
        """Listen; a RuntimeError in the user's words when the port cannot be had."""
        if not self.listen:
            return
        host, _, port = self.listen.rpartition(":")
        # A short shutdown_timeout: an open `evagg tail` must not hold the exit for minutes.
        # auto_decompress off: the routes inflate bodies themselves (ingest/bodies.py).
        # A request's headers take frame_timeout at most, as a frame on the socket does.
        # Its logger says in one line what an HTTP/2 (OTLP/gRPC) client must change.
        self._server_log = ServerLog(self.listen, self._refuse_http2)
        self._runner = listener.runner(self.api.app(), stall_s=self.stall_s,
                                       shutdown_timeout=2.0, auto_decompress=False,
                                       logger=self._server_log.logger)
        await self._runner.setup()
        try:
            self._server = await listener.serve(
                self._runner, host.strip("[]"), int(port),
                max_connections=self.max_connections, on_refused=self._refuse_connection)
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            taken = AddressTaken if exc.errno == errno.EADDRINUSE else RuntimeError
            raise taken(http_port_problem(self.listen, exc)) from None
        if not otlp.readable():  # else said only to each exporter, which drops its spans
            # Info, not a warning: the README's install has no OTLP, and most never use it.
            log.info("OTLP is off in this install: http://%s/v1/traces answers 501 (%s)",
                     self.listen, otlp.NO_OTLP)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server_log is not None:
            self._server_log.close()

    def _refuse_http2(self) -> None:
        self.metrics.bad_input.inc(route="http", reason="http2_client")

    def _refuse_connection(self) -> None:
        self.metrics.bad_input.inc(route="http", reason="too_many_connections")
        self._log.log(logging.WARNING, "over_cap", "closing HTTP connections beyond "
                      "max_connections = %d", self.max_connections)


def http_port_problem(listen: str, exc: OSError) -> str:
    """Why the HTTP port cannot be opened, in the words of the socket and spool clashes."""
    port = listen.rpartition(":")[2]
    if exc.errno == errno.EADDRINUSE:
        why = (f"something is already listening on {listen} (another agent? `ss -ltnp "
               f"'sport = :{port}'` shows which)")
        outgoing = _outgoing_ports()
        if port.isdigit() and outgoing and outgoing[0] <= int(port) <= outgoing[1]:
            why += (f", or an outgoing connection holds it: {port} is among the ports "
                    f"{outgoing[0]}-{outgoing[1]} the kernel gives those (`ss -tnp "
                    f"'sport = :{port}'`); a port below {outgoing[0]} never clashes so")
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = f"{listen.rpartition(':')[0]} is not an address of this machine"
    elif exc.errno == errno.EACCES:
        why = f"port {port} needs privileges on this machine; choose one above 1023"
    else:
        why = exc.strerror or str(exc)
    return (f"cannot open the HTTP port {listen}: {why}; set agent.http_listen (or "
            "--http-listen) to a free host:port, or to \"\" to run without the HTTP port")


def _outgoing_ports() -> tuple[int, int] | None:
    """The kernel's range of local ports for outgoing connections (Linux), if known."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None
