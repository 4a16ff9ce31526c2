"""Waiting for a condition in a test: poll it, and fail saying what never happened.

The one way tests wait for something another process or thread does, instead of a
fixed sleep that a busy machine outlasts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str | Callable[[], str],
             interval: float = 0.1) -> T:
    """Poll `check` until it gives a true value, and return that value; on timeout fail
    with `what` (a callable is asked only then)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        time.sleep(interval)


def wait_until(holds: Callable[[], bool], timeout: float, what: str | Callable[[], str],
               interval: float = 0.1) -> None:
    """Poll `holds` until it is true; on timeout fail with `what`."""
    wait_for(holds, timeout, what, interval)
