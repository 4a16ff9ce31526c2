"""A FlakyServer (real aiohttp, tests/sinks/flaky_server.py) on an event loop of its own
in a thread, for tests that drive an agent synchronously: the one way the suite runs an
HTTP endpoint beside a real agent."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tests.sinks.flaky_server import FlakyServer

T = TypeVar("T")


class ServerThread:
    """`ServerThread().start()`: an endpoint at `.url`; `.do(lambda: .server.answer(...))`
    scripts its answers from the test's thread; `.close()` ends it."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FlakyServer(ssl_context=ssl_context)
        self._thread = threading.Thread(target=self.loop.run_forever, name="endpoint",
                                        daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def do(self, action: Callable[[], Any]) -> None:
        """Run `action` on the server's loop (the server's own methods are not threadsafe)."""
        async def run() -> None:
            action()
        self.call(run())

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> ServerThread:
        self.call(self.server.start())
        return self

    def stop(self) -> None:
        """Close the port: the agent's connections are refused until start()."""
        self.call(self.server.stop())

    def answer_always(self, status: int) -> None:
        self.do(lambda: self.server.answer(status, times=None))

    def stall(self, seconds: float) -> None:
        self.do(lambda: self.server.stall(seconds))

    def accepted_events(self) -> list[dict[str, Any]]:
        """Every event of every 2xx-answered request, duplicates included."""
        async def collect() -> list[dict[str, Any]]:
            return [event for seen in self.server.requests if 200 <= seen.status < 300
                    for event in seen.events]
        return self.call(collect())

    def statuses(self) -> list[int]:
        async def collect() -> list[int]:
            return [seen.status for seen in self.server.requests]
        return self.call(collect())

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
