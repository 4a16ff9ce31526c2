"""The Ray log follower: a background worker that ships the log files Ray's events name.

Every `interval_s` (and again at once while a file has more than one piece waiting) it
reads what grew, in a thread, writes each piece compressed to the store's staging path,
writes the pieces' ranges down (state.py), then publishes them through the same store
objects the Parquet sink uses, and only then counts them shipped. It never raises into
the agent: a failed cycle is counted in `evagg_worker_errors_total{worker="ray_logs"}`
and logged, and the next cycle starts where the last one stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

import pyarrow as pa

from aggregator.losses import LossRecorder
from aggregator.metrics import AgentMetrics
from aggregator.raylogs.named import NamedFile, inside, named_in, session_logs_dir
from aggregator.raylogs.reading import APPEAR_WAIT_S, MAX_PIECE_BYTES, Lost, Piece, step
from aggregator.raylogs.state import Followed, FollowState
from aggregator.worker_errors import WorkerErrors
from emitters.ratelimit import RateLimitedLog
from emitters.thread_names import name_this_thread
from sinks.parquet.stores import LocalStore, ObjectStore, is_staging_name
from sinks.raylogs.layout import LOGS_ROOT, compress_piece, piece_key

log = logging.getLogger("evagg.raylogs")
MAX_WAITING_BATCHES: Final = 10_000  # Ray bodies not yet looked at (about 10 minutes' worth)
# Paths refused once, not resolved again each time a task names them: with log_dir not
# set to Ray's temp dir every executor event names two, and resolving them cost a fifth
# of the agent's CPU on Ray's export (bench/bench_ray_export.py).
MAX_REFUSED_PATHS: Final = 10_000
LOGS_NICENESS: Final = 10  # added to the follower thread's nice value
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Staged:
    followed: Followed
    end: int
    key: str
    path: Path
    size: int


class RayLogFollower:
    def __init__(self, log_dir: Path, store: ObjectStore, state_dir: Path,
                 metrics: AgentMetrics, losses: LossRecorder, interval_s: float = 2.0) -> None:
        self.log_dir = log_dir
        self.store = store
        self.state = FollowState(state_dir)
        self.metrics = metrics
        self.losses = losses
        self.interval_s = interval_s
        self._batches: deque[pa.RecordBatch] = deque()
        self._workers: dict[tuple[str, int], tuple[NamedFile, float]] = {}
        self._refused_paths: set[str] = set()
        self._said = RateLimitedLog(log)
        self._errors = WorkerErrors(metrics, log)
        self._started = False  # the saved state is read: cycles may write it
        # One thread of its own, at a lower CPU priority: compressing logs yields the
        # cores to the event path (the acks) when both want them.
        self._thread = ThreadPoolExecutor(1, "ray-logs", initializer=_set_up_thread)
        registry = metrics.registry
        self.shipped_bytes = registry.counter(
            "evagg_ray_log_bytes_total", "Bytes of Ray log files written to the lake")
        self.pieces = registry.counter(
            "evagg_ray_log_pieces_total", "Pieces of Ray log files written to the lake")
        self.lost_bytes = registry.counter(
            "evagg_ray_log_lost_bytes_total", "Bytes of Ray log files that could not be read")
        self.refused = registry.counter(
            "evagg_ray_log_refused_total", "Files Ray named that the agent will not open")

    # -- what the HTTP route hands over ------------------------------------------------------

    def note(self, batch: pa.RecordBatch) -> None:
        """A spooled batch of Ray rows; looked at in the next cycle, off the event loop."""
        if len(self._batches) >= MAX_WAITING_BATCHES:
            self.metrics.worker_errors.inc(worker="ray_logs", type="too_many_waiting")
            self._said.log(logging.WARNING, "waiting", "Ray log follower is behind: a batch of "
                           "Ray events was not looked at for log files")
            return
        self._batches.append(batch)

    # -- the worker -------------------------------------------------------------------------

    async def run(self) -> None:
        await self._in_thread(self._start)
        while True:
            await asyncio.sleep(self.interval_s)
            await self.ship_all()

    async def ship_all(self) -> None:
        """Cycles until nothing is left to read (one cycle ships one piece a file)."""
        while self._started and await self._guarded_cycle():
            pass

    async def _guarded_cycle(self) -> bool:
        try:
            return await self.cycle()
        except Exception as exc:  # the next cycle starts from the saved state
            self._errors.failed("ray_logs", exc, "shipping Ray log files failed; trying again "
                                "in %.0fs", self.interval_s)
            return False

    async def cycle(self) -> bool:
        """Read and publish one piece of every file that grew; True if more is waiting."""
        staged = await self._in_thread(self._prepare)
        more = False
        for item in staged:
            try:
                await self.store.publish(item.path, item.key)
            except Exception as exc:  # the range stays written down: the same key next time
                self._errors.failed("ray_logs", exc, "could not write a Ray log piece to %s; it "
                                    "is sent again in the next cycle", self.store.describe(),
                                    level=logging.WARNING)
                with contextlib.suppress(OSError):
                    item.path.unlink()
                continue
            more = more or item.size >= MAX_PIECE_BYTES
            self._shipped(item)
        await self._in_thread(self.state.save)
        return more

    async def _in_thread(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    # -- in the thread -----------------------------------------------------------------------

    def _start(self) -> None:
        self.state.load()
        removed = self._remove_staging()
        if removed:
            log.info("removed %d Ray log pieces a stopped agent left half written", removed)
        self._started = True

    def _remove_staging(self) -> int:
        if not isinstance(self.store, LocalStore):
            return self.store.cleanup_staging()  # S3: a staging directory of our own
        removed = 0  # a local lake: only under _logs, never the Parquet sink's files
        for directory, _, files in os.walk(self.store.root / LOGS_ROOT):
            for name in files:
                if is_staging_name(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))
                        removed += 1
        return removed

    def _prepare(self) -> list[Staged]:
        now = time.time()
        self._take_batches(now)
        self._resolve_workers(now)
        staged = []
        for followed in self.state.files.values():
            if followed.done:
                continue
            before = _where(followed)
            found = step(followed, self.log_dir, now)
            if isinstance(found, Lost):
                self._lost(found)
            elif isinstance(found, Piece):
                staged.append(self._stage(found))
            if _where(followed) != before:  # an idle file costs no write of the state
                self.state.dirty = True
        self.state.save()  # the ranges about to be published, before they are
        return staged

    def _take_batches(self, now: float) -> None:
        while self._batches:
            for named in named_in(self._batches.popleft()):
                if named.worker is not None:
                    self._workers.setdefault(named.worker, (named, now))
                else:
                    self._follow(named.session, named.node, named.path, now)

    def _resolve_workers(self, now: float) -> None:
        """A worker's files are found by its id and pid in its session's logs directory."""
        for worker, (named, since) in list(self._workers.items()):
            folder = session_logs_dir(self.log_dir, named.session)
            names: list[str] = []
            if folder is not None:
                with contextlib.suppress(OSError):
                    names = [n for n in os.listdir(folder) if named.matches(n)]
                for name in names:
                    self._follow(named.session, named.node, str(folder / name), now)
            if len(names) >= 2 or now - since > APPEAR_WAIT_S:
                del self._workers[worker]

    def _follow(self, session: str, node: str, path: str, now: float) -> None:
        if path in self.state.files or path in self._refused_paths:
            return
        if not inside(self.log_dir, path):
            if len(self._refused_paths) >= MAX_REFUSED_PATHS:
                self._refused_paths.clear()
            self._refused_paths.add(path)  # counted once per file, not per mention
            self.refused.inc(reason="outside_log_dir")
            self._said.log(logging.WARNING, "outside", "Ray named a log file outside "
                           "[ray] log_dir %s (%s): not collected; set log_dir to Ray's "
                           "--temp-dir on this node", self.log_dir, path)
            return
        self.state.files[path] = Followed(session=session, node=node, path=path, named_at=now)
        self.state.dirty = True

    def _stage(self, piece: Piece) -> Staged:
        followed = piece.followed
        key = piece_key(followed.log_file(), piece.start, piece.end)
        path = self.store.staging_path(key)
        body = compress_piece(piece.data)
        path.write_bytes(body)
        followed.intent_end = piece.end
        return Staged(followed, piece.end, key, path, piece.end - piece.start)

    def _shipped(self, item: Staged) -> None:
        followed = item.followed
        followed.offset, followed.intent_end = item.end, None
        self.state.dirty = True
        self.shipped_bytes.inc(item.size)
        self.pieces.inc()

    def _lost(self, lost: Lost) -> None:
        if lost.reason == "ray_log_refused":
            self.refused.inc(reason="not_a_file")
            return
        self.losses.record(lost.reason, 1)
        self.lost_bytes.inc(lost.unread_bytes, reason=lost.reason)
        self._said.log(logging.WARNING, lost.reason, "Ray log file %s: %s (%d bytes never "
                       "read); counted as a loss", lost.followed.path,
                       _WHY[lost.reason], lost.unread_bytes)


def _where(followed: Followed) -> tuple[object, ...]:
    return (followed.generation, followed.inode, followed.offset, followed.seen_size,
            followed.intent_end, followed.done)


def _set_up_thread() -> None:
    """The follower thread's name for `top`, and a lower priority: Linux sets a nice
    value per thread; elsewhere the thread keeps the process's."""
    name_this_thread()
    with contextlib.suppress(OSError, AttributeError):
        thread = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, nice + LOGS_NICENESS))


_WHY: Final = {
    "ray_log_deleted": "deleted or replaced before the agent read all of it",
    "ray_log_missing": f"never appeared within {APPEAR_WAIT_S:.0f}s of the event naming it",
    "ray_log_truncated": "truncated before the agent read all of it",
}
