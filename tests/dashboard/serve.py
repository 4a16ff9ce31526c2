"""The dashboard's aiohttp app served from a background thread, for tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from dashboard.lake.store import Store
from dashboard.web.app import create_app


@contextmanager
def serving(store: Store, *, timeout_s: float = 60.0) -> Iterator[str]:
    """Serve `store` on a free loopback port; yields the base URL; stops on exit."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, object] = {}

    async def start() -> None:
        runner = web.AppRunner(create_app(store, timeout_s=timeout_s), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        ready.set()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the dashboard did not start")
    try:
        yield f"http://127.0.0.1:{holder['port']}"
    finally:
        runner = holder["runner"]
        assert isinstance(runner, web.AppRunner)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
