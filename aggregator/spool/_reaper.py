"""Unlinks of collected segments in one background thread, off the event loop.

Unlinking a segment of many MiB frees its blocks synchronously (about 40 ms on ext4), so
the segments every cursor has passed are handed to this one worker thread instead of
being unlinked on the event loop. Until an unlink has happened its bytes still count in
the spool's `bytes_used`: the worker reports each unlink back to the loop
(`call_soon_threadsafe`), and only then is the space counted free and a full spool's
waiting appends woken.

The worker never dies of an error and never raises into the caller: a failed unlink is
counted by reason, logged once per reason, and retried with a growing pause (1 s to
30 s); its bytes stay counted, as the file stays on disk. `stop()` waits briefly for what
is queued; what it leaves is collected at the next start (those segments lie behind every
cursor, so `register_sinks` deletes them again).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from emitters.thread_names import name_this_thread

log = logging.getLogger("evagg.spool")

THREAD_NAME = "evagg-spool-unlink"
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


@dataclass(slots=True)
class Doomed:
    """One segment file to unlink, and the bytes it frees."""

    path: Path
    size: int


@dataclass(slots=True)
class Reaped:
    """One unlink's outcome: `error` is None once the file is gone, else a reason."""

    doomed: Doomed
    error: str | None


class SegmentReaper:
    def __init__(self, unlink: Callable[[Path], None]) -> None:
        self._unlink = unlink
        self._cond = threading.Condition()
        self._queue: deque[Doomed] = deque()
        self._retry: list[Doomed] = []
        self._done: list[Reaped] = []  # taken by the loop (`take_done`)
        self._in_flight = 0  # taken from the queue, not yet in _done
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_done: Callable[[], None] = _nothing
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._abandon = False
        self._retry_delay = RETRY_FIRST_S

    def submit(self, doomed: list[Doomed], loop: asyncio.AbstractEventLoop,
               on_done: Callable[[], None]) -> None:
        """Queue unlinks; `on_done` runs on `loop` after each one (success or failure)."""
        with self._cond:
            self._loop, self._on_done = loop, on_done
            self._queue.extend(doomed)
            if self._thread is None or not self._thread.is_alive():
                self._stopping = self._abandon = False
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def busy(self) -> bool:
        """Unlinks queued or running (retries waiting out their pause do not count)."""
        with self._cond:
            return bool(self._queue) or self._in_flight > 0

    def take_done(self) -> list[Reaped]:
        with self._cond:
            done, self._done = self._done, []
            return done

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is queued or running; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and self._in_flight == 0,
                                       timeout)

    def stop(self, timeout: float) -> int:
        """Let the worker finish what is queued within `timeout`, then end it. Returns how
        many unlinks are left for the next start (queued, running or waiting to retry)."""
        with self._cond:
            thread = self._thread
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._abandon = True  # a worker still in an unlink stops after it
            self._cond.notify_all()
            left = len(self._queue) + self._in_flight + len(self._retry)
            self._queue.clear()
            self._retry.clear()
            return left

    # -- the worker thread -----------------------------------------------------------------

    def _run(self) -> None:
        name_this_thread()
        while True:
            item = self._next()
            if item is None:
                return
            try:
                self._unlink(item.path)
                error = None
            except Exception as exc:  # counted, logged, retried; never raised here or there
                error = _reason(exc)
            self._finish(Reaped(item, error))

    def _next(self) -> Doomed | None:
        with self._cond:
            while True:
                if self._abandon or (self._stopping and not self._queue):
                    return None
                if self._queue:
                    self._in_flight += 1
                    return self._queue.popleft()
                if self._retry and not self._stopping:
                    if not self._cond.wait(self._retry_delay) and not self._queue:
                        self._queue.extend(self._retry)  # the pause is over: try again
                        self._retry.clear()
                        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
                    continue
                self._cond.wait()

    def _finish(self, reaped: Reaped) -> None:
        with self._cond:
            self._in_flight -= 1
            self._done.append(reaped)
            if reaped.error is None:
                self._retry_delay = RETRY_FIRST_S
            else:
                self._retry.append(reaped.doomed)
            loop, on_done = self._loop, self._on_done
            self._cond.notify_all()
        if loop is not None:
            # A closed loop raises RuntimeError: the next submit or close settles it instead.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(on_done)


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, f"errno_{exc.errno}")
    return type(exc).__name__


def _nothing() -> None:
    return None
