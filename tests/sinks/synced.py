"""Async test bodies run by plain pytest (the suite has no asyncio plugin)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any


def synced(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body in its own event loop; its arguments stay pytest fixtures."""
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))  # type: ignore[arg-type]

    return wrapper
