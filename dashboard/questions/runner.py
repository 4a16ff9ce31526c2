"""Runs the dashboard's queries off the event loop, with a timeout and a result cache.

DuckDB work happens in a small thread pool (each query on its own cursor of the one
cached connection). A query that runs past the timeout is interrupted and answered with
a 503. Results are cached by (path, parameters) for the store version they were computed
on: the version is the file list's fingerprint, relisted at most every refresh_s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from dashboard.lake.cancel import CancelToken, cancel_scope
from dashboard.lake.errors import StoreUnavailable
from dashboard.lake.listing import Listing
from dashboard.lake.store import Store


class QueryRunner:
    def __init__(self, store: Store, *, timeout_s: float = 60.0, workers: int = 2,
                 cache_entries: int = 256) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.cache_entries = cache_entries
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="query")
        self._cache: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, Any]] = (
            OrderedDict())

    async def run(self, func: Callable[[], Any]) -> Any:
        token = CancelToken(f"the query took longer than {self.timeout_s:g} s and was stopped")

        def work() -> Any:
            with cancel_scope(token):
                return func()

        future = asyncio.get_running_loop().run_in_executor(self._pool, work)
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: it can lose a cancel
                return await asyncio.shield(future)
        except TimeoutError:
            token.cancel()
            raise StoreUnavailable(token.reason) from None
        except asyncio.CancelledError:
            token.cancel()  # the client went away: stop the work it asked for
            raise

    async def refresh(self) -> Listing:
        """The listing (its fingerprint is the version); folds new files, and leaves the
        views over the files to the first query that needs them."""
        listing: Listing = await self.run(lambda: self.store.refresh(views=False))
        return listing

    async def cached(self, path: str, params: dict[str, str], compute: Callable[[], Any]) -> Any:
        version = (await self.refresh()).fingerprint
        key = (path, tuple(sorted(params.items())))
        hit = self._cache.get(key)
        if hit is not None and hit[0] == version:
            self._cache.move_to_end(key)
            return hit[1]
        value = await self.run(compute)
        self._cache[key] = (version, value)
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_entries:
            self._cache.popitem(last=False)
        return value

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
