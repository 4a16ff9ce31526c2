"""Waiting for a condition in a test: poll it, and fail saying what never happened.

The one way tests wait for something another process or thread does, instead of a
fixed sleep that a busy machine outlasts.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(holds: Callable[[], bool], timeout: float, what: str | Callable[[], str],
               interval: float = 0.1) -> None:
    """Poll `holds`; on timeout fail with `what` (a callable is asked only then)."""
    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        time.sleep(interval)
