"""Cancelling a running DuckDB query from another thread (the web server's timeout)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dashboard.lake.errors import StoreUnavailable

_local = threading.local()


class CancelToken:
    """Holds the cursor a request's thread is running; `cancel()` interrupts it."""

    def __init__(self, reason: str = "the query was cancelled (it took too long)") -> None:
        self.reason = reason
        self._lock = threading.Lock()
        self._cursor: Any = None
        self.cancelled = False

    def attach(self, cursor: Any) -> None:
        with self._lock:
            if self.cancelled:
                raise StoreUnavailable(self.reason)
            self._cursor = cursor

    def detach(self) -> None:
        with self._lock:
            self._cursor = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._cursor is not None:
                self._cursor.interrupt()


@contextmanager
def cancel_scope(token: CancelToken) -> Iterator[CancelToken]:
    """Queries run by this thread inside the block can be interrupted through `token`."""
    previous = getattr(_local, "token", None)
    _local.token = token
    try:
        yield token
    finally:
        _local.token = previous


def current_token() -> CancelToken | None:
    token = getattr(_local, "token", None)
    return token if isinstance(token, CancelToken) else None
