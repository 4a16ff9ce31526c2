"""The artifact shipper: a background worker that ships each finished file of the
`[[files]]` directories into the lake once, with an `artifact` index event.

Every `interval_s` it looks at the directories in a thread, copies each finished file
that is new or changed to the store's staging path while hashing it, writes down what
it is about to ship (state.py), publishes it through the same store objects the Parquet
sink uses, and spools the index event. It never raises into the agent: a failure is
counted in `evagg_worker_errors_total{worker="artifacts"}`, logged once a minute, and
the file is tried again in the next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aggregator.artifacts.finding import (
    Candidate,
    candidates,
    open_for_writing,
    settled,
    still_inside,
    watched_exists,
)
from aggregator.artifacts.state import Shipped, ShippedState
from aggregator.config.files import WatchedFiles
from aggregator.ingest.ingestor import Ingestor
from aggregator.metrics import AgentMetrics
from aggregator.worker_errors import WorkerErrors
from sinks.artifacts.layout import ARTIFACT_KIND, artifact_event_id, artifact_key
from sinks.parquet.stores import LocalStore, ObjectStore

log = logging.getLogger("evagg.artifacts")
CHUNK: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Staged:
    candidate: Candidate
    record: Shipped
    key: str
    staged: Path


class ArtifactShipper:
    def __init__(self, watched: Sequence[WatchedFiles], store: ObjectStore, state_dir: Path,
                 ingestor: Ingestor, metrics: AgentMetrics, *, node_id: str, host: str,
                 interval_s: float = 2.0) -> None:
        self.watched = tuple(watched)
        self.store = store
        self.state = ShippedState(state_dir)
        self.ingestor = ingestor
        self.metrics = metrics
        self.node_id, self.host = node_id, host
        self.interval_s = interval_s
        self._errors = WorkerErrors(metrics, log)
        self._missing: set[Path] = set()  # watched directories said to be missing
        self._started = False
        registry = metrics.registry
        self.shipped = registry.counter(
            "evagg_artifacts_shipped_total", "Finished files shipped into the lake, by kind")
        self.shipped_bytes = registry.counter(
            "evagg_artifact_bytes_total", "Bytes of finished files shipped into the lake")

    async def run(self) -> None:
        while True:
            if not self._started:  # the state is read first (again, until it can be)
                await self._guarded(self._start_in_thread)
            await asyncio.sleep(self.interval_s)
            await self.ship_once()

    async def ship_once(self) -> None:
        if self._started:
            await self._guarded(self.cycle)

    async def _start_in_thread(self) -> None:
        await asyncio.to_thread(self._start)
        self._started = True

    def _start(self) -> None:
        self.state.load()
        if not isinstance(self.store, LocalStore):  # S3: a staging directory of our own;
            self.store.cleanup_staging()  # a local lake's are the Parquet sink's to sweep

    async def _guarded(self, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except Exception as exc:  # the next cycle looks again
            self._errors.failed("artifacts", exc, "shipping finished files failed; trying "
                                "again in %.0fs", self.interval_s, level=logging.WARNING)

    async def cycle(self) -> None:
        """Ship every file that finished since the last look."""
        for item in await asyncio.to_thread(self._prepare):
            try:
                await self.store.publish(item.staged, item.key)
                await self._index(item)
            except Exception as exc:  # written down unindexed: the same key next cycle
                self._errors.failed("artifacts", exc, "could not ship %s to %s; it is sent "
                                    "again in the next cycle", item.candidate.path,
                                    self.store.describe(), level=logging.WARNING)
                with contextlib.suppress(OSError):
                    item.staged.unlink()
                continue
            item.record.indexed = True
            await asyncio.to_thread(self.state.save)
            self.shipped.inc(kind=item.candidate.watched.kind)
            self.shipped_bytes.inc(item.record.size)

    # -- in the thread -----------------------------------------------------------------------

    def _prepare(self) -> list[Staged]:
        now_ns = time.time_ns()
        waiting = [c for c in self._changed() if settled(c, now_ns)]
        held = open_for_writing({(c.device, c.inode) for c in waiting})
        staged = []
        for candidate in waiting:
            if (candidate.device, candidate.inode) in held:
                continue  # still being written: looked at again next cycle
            try:
                item = self._stage(candidate)
            except OSError as exc:
                self._errors.failed("artifacts", exc, "could not read %s; trying again",
                                    candidate.path, level=logging.WARNING)
                continue
            if item is not None:
                staged.append(item)
        return staged

    def _changed(self) -> list[Candidate]:
        """Files whose size or time differs from what was last shipped from their path."""
        out = []
        for watched in self.watched:
            if not watched_exists(watched):
                if watched.path not in self._missing:
                    log.info("watched directory %s does not exist (yet): its files are "
                             "shipped once it does", watched.path)
                    self._missing.add(watched.path)
                continue
            self._missing.discard(watched.path)
            for candidate in candidates(watched):
                record = self.state.files.get(candidate.path)
                if record is None or not record.indexed \
                        or (record.size, record.mtime_ns) != candidate.identity:
                    out.append(candidate)
        return out

    def _stage(self, candidate: Candidate) -> Staged | None:
        """Copy the file to staging while hashing it; None when it changed meanwhile or
        holds what was already shipped."""
        if not still_inside(candidate.watched, candidate.path):
            return None
        record = self.state.files.get(candidate.path)
        version = (record.version if record else 0) + 1
        key = artifact_key(self.node_id, candidate.name, version)
        staged = self.store.staging_path(key)
        digest = _copy_hashing(candidate, staged)
        if digest is None:
            return None
        if record is not None and record.sha256 == digest:
            if record.indexed:  # touched, same bytes: nothing new to ship
                record.size, record.mtime_ns = candidate.identity
                self.state.save()
                staged.unlink()
                return None
            version -= 1  # written down before a kill: the same version, key and bytes
            key = artifact_key(self.node_id, candidate.name, version)
            staged = _moved(staged, self.store.staging_path(key))
        record = Shipped(candidate.path, candidate.size, candidate.mtime_ns, digest, version)
        self.state.files[candidate.path] = record
        self.state.save()  # before the object exists: a kill ships this same version again
        return Staged(candidate, record, key, staged)

    # -- the index event ---------------------------------------------------------------------

    async def _index(self, item: Staged) -> None:
        row = self.event(item.candidate, item.record, item.key)
        result = await self.ingestor.ingest_rows(
            [row], self.ingestor.stamp(os.getpid(), os.getuid()), route="agent")
        if result.accepted != 1:
            raise RuntimeError(f"the artifact event was refused: {result.note}")

    def event(self, candidate: Candidate, record: Shipped, key: str) -> dict[str, Any]:
        watched = candidate.watched
        return {
            "event_id": artifact_event_id(self.node_id, candidate.name, record.version),
            "time": record.mtime_ns,  # when the file was finished
            "kind": ARTIFACT_KIND, "source": "evagg", "name": candidate.name,
            "state": "SHIPPED", "node_id": self.node_id, "host": self.host,
            "run_id": candidate.run_id, "job_id": watched.job_id,
            "metrics": {"size_bytes": float(record.size)},
            "attrs": {"artifact_kind": watched.kind, "sha256": record.sha256,
                      "version": str(record.version), "lake_key": key,
                      "size_bytes": str(record.size), "path": candidate.path},
        }


def _copy_hashing(candidate: Candidate, staged: Path) -> str | None:
    """The sha256 of the bytes copied; None (and no staged file) if the file is not the
    one that was looked at, or changed while it was copied."""
    digest = hashlib.sha256()
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    source = os.open(candidate.path, flags)
    try:
        before = os.fstat(source)
        if (before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns) != (
                candidate.device, candidate.inode, *candidate.identity):
            return None
        with staged.open("wb") as out:
            while chunk := os.read(source, CHUNK):
                digest.update(chunk)
                out.write(chunk)
        after = os.fstat(source)
    finally:
        os.close(source)
    if (after.st_size, after.st_mtime_ns) != candidate.identity:
        staged.unlink()
        return None
    return digest.hexdigest()


def _moved(staged: Path, to: Path) -> Path:
    os.replace(staged, to)
    return to
