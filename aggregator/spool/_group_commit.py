"""The fsyncs of one spool's segment files, in a thread, shared by the appends that wait.

With fsync "always" every append waits for an fsync of the segment it went to, and the
appends that arrive while one runs share the next (group commit). In both modes, segments
rolled away are fsynced and closed in the same thread, with the directory when a file was
created in it. An fd a job may hold is closed by that job, by close() or by
discard_active() (a segment deleted while written to), under `fd_lock`, so none closes
one another is fsyncing; sealed fds no job has taken yet are closed by forget().
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from aggregator.spool._counters import SpoolCounters
from sinks.durable import fsync_directory

log = logging.getLogger("evagg.spool")

# (the active segment's fd when every append waits for its fsync, the last offset written)
Position = Callable[[], tuple[int | None, int]]


class GroupCommit:
    def __init__(self, directory: Path, *, fsync_always: bool, counters: SpoolCounters,
                 position: Position, on_synced: Callable[[int], None]) -> None:
        self.directory = directory
        self.fsync_always = fsync_always
        self.counters = counters
        self._position = position
        self._on_synced = on_synced  # "always": offsets through here became durable
        self.synced = 0  # fsynced through here
        self.closed = False
        self.fd_lock = threading.Lock()
        self._sealed: list[tuple[Path, int]] = []  # rolled-away segments to fsync and close
        self._dir_dirty = False
        self._job: asyncio.Future[int] | None = None
        # bumped when the active fd is closed outside close(): a job queued before that
        # must not fsync the number, which may be another file's by then
        self._active_epoch = 0

    def seal(self, path: Path, fd: int) -> None:
        """A segment no longer appended to: fsync and close it with the next job."""
        self._sealed.append((path, fd))

    def directory_changed(self) -> None:
        self._dir_dirty = True

    def forget(self, paths: set[Path]) -> None:
        """Close the sealed fds of segments being deleted, without the fsync they will
        never need. No job holds them (a job takes its fds when it starts), so no lock:
        waiting here for a running fsync of other files would stall the event loop."""
        for path, fd in [(p, fd) for p, fd in self._sealed if p in paths]:
            self._sealed.remove((path, fd))
            os.close(fd)

    def discard_active(self, fd: int) -> None:
        """Close the active segment's fd without an fsync: its segment is being deleted.
        A job queued with it will skip it (the epoch moved); one running has finished
        with it once the lock is ours."""
        with self.fd_lock:
            self._active_epoch += 1
            os.close(fd)

    async def through(self, offset: int) -> None:
        """Return once `offset` is fsynced; appends arriving meanwhile share the next fsync."""
        while self.synced < offset:
            if self.closed:
                raise OSError("spool closed before the record was fsynced")
            job = self._job or self._start()
            await asyncio.shield(job)

    def in_background(self) -> None:
        """Fsync and close the sealed segments in the thread (here, outside a loop)."""
        if self._job is not None or not self._sealed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop: do it here
            with self.fd_lock:
                self._close_fds(self._take_sealed())
            return
        self._start()

    def _start(self) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        sealed = self._take_sealed()
        active, target = self._position()
        sync_dir, self._dir_dirty = self._dir_dirty, False
        job = loop.run_in_executor(None, self._sync_files, sealed, active, sync_dir,
                                   self._active_epoch)
        job.add_done_callback(partial(self._finished, target))
        self._job = job
        return job

    def _sync_files(self, sealed: list[int], active: int | None, sync_dir: bool,
                    epoch: int) -> int:
        """Runs in a thread. Owns `sealed` (closes them); `active` is closed by close() or
        discard_active(), under the lock, which also moves the epoch."""
        done = 0
        with self.fd_lock:
            try:
                for fd in sealed:
                    os.fsync(fd)
                    done += 1
                if active is not None and not self.closed and epoch == self._active_epoch:
                    os.fsync(active)
                    done += 1
                if sync_dir:
                    fsync_directory(self.directory)
            finally:
                for fd in sealed:
                    os.close(fd)
        return done

    def _finished(self, target: int, job: asyncio.Future[int]) -> None:
        self._job = None
        if job.cancelled():
            return
        error = job.exception()
        if error is not None:
            self.counters.fsync_errors += 1
            log.warning("spool: fsync failed: %s", error)
        else:
            self.counters.fsyncs += job.result()
            if self.fsync_always and target > self.synced:
                self.synced = target
                self._on_synced(target)
        if self._sealed and not self.closed:
            self._start()

    def close(self, active: int | None, last_offset: int) -> None:
        """Fsync and close every fd, the active segment's too; waits for a running job."""
        with self.fd_lock:
            self.closed = True
            fds = self._take_sealed()
            if active is not None:
                fds.append(active)
            if self._close_fds(fds):
                self.synced = last_offset

    def _take_sealed(self) -> list[int]:
        fds = [fd for _, fd in self._sealed]
        self._sealed = []
        return fds

    def _close_fds(self, fds: list[int]) -> bool:
        ok = True
        for fd in fds:
            try:
                os.fsync(fd)
                self.counters.fsyncs += 1
            except OSError as exc:
                ok = False
                log.warning("spool: fsync at close failed: %s", exc)
            finally:
                os.close(fd)
        try:
            fsync_directory(self.directory)
        except OSError as exc:
            log.warning("spool: directory fsync failed: %s", exc)
        return ok
