"""The agent's liveness worker: ends what a dead process left open (docs/ray.md,
"Differences from a live cluster"; docs/emitters.md).

The ingestor hands every stored batch to `extract` (in its worker thread) and `apply`
(on the loop, once the spool has it). Once a check (every second) the worker reads
/proc/<pid>/stat of each tracked process only; a process found gone gets
`inferred_end_grace` for a real end to arrive (Ray flushes task events every second and
its GCS marks a dead driver's tasks failed about 5 s later), then the worker writes the
inferred ends of what is still open through the ingestor, like the heartbeat, so every
sink gets them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from aggregator.ingest.ingestor import Ingestor
from aggregator.liveness import procs, restart
from aggregator.liveness.ends import actor_end, attempt_end, job_end
from aggregator.liveness.facts import NO_ENDS, BatchFacts, facts_of
from aggregator.liveness.openset import Attempt, OpenSet, Process
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from aggregator.worker_errors import WorkerErrors

log = logging.getLogger("evagg.agent")
CHECK_INTERVAL_S = 1.0
ENDS_PER_RECORD = 2_000  # rows per spool record of inferred ends
SNAPSHOT_INTERVAL_S = 5.0  # the seen log and the spool replay cover the time between


class LivenessWatch:
    def __init__(self, ingestor: Ingestor, metrics: AgentMetrics, *, spool: Spool,
                 state_dir: Path, host: str, grace_s: float) -> None:
        self.ingestor = ingestor
        self.metrics = metrics
        self._errors = WorkerErrors(metrics, log)
        self.spool = spool
        self.state_dir = state_dir
        self.host = host
        self.grace_ns = int(grace_s * 1e9)
        self.open = OpenSet()
        self.seen = restart.SeenLog(state_dir)
        self._unwritten: list[dict[str, Any]] = []  # ends whose write failed: next check
        self._next_snapshot = 0.0  # time.monotonic() of the next snapshot write
        self.inferred = metrics.registry.counter(
            "evagg_inferred_ends_total",
            "Ends evagg wrote for attempts, ops, jobs and actors whose process died without "
            "a terminal event, by kind and reason.")
        if self.enabled:
            metrics.registry.add_gauge_source(self._gauges)

    @property
    def enabled(self) -> bool:
        return self.grace_ns > 0

    # -- fed by the ingestor ---------------------------------------------------------------

    def extract(self, batch: pa.RecordBatch) -> BatchFacts:
        """In the ingestor's worker thread: the few columns that matter. Never raises:
        the batch is stored whatever this makes of it, only its watching can be lost."""
        try:
            # read off the loop's open set without a lock: a producer's own starts were
            # applied before its next frame is decoded, and only they can be its ends' keys
            return facts_of(batch, ops_open=self.open.open_ops > 0)
        except Exception as exc:
            self._errors.failed("liveness", exc, "could not pick the attempts of a batch; "
                                "its events are stored, only their watching is lost")
            return BatchFacts([], NO_ENDS, NO_ENDS)

    def apply(self, facts: BatchFacts) -> None:
        """On the loop, after the spool stored the batch; never raises into the ingest."""
        try:
            self.open.apply(facts)
        except Exception as exc:  # the batch is stored: only its watching is lost
            self._errors.failed("liveness", exc, "could not note the attempts of a stored "
                                "batch; its events are stored, only their watching is lost")

    # -- start -----------------------------------------------------------------------------

    def restore(self) -> None:
        """The open set the last agent left: its snapshot, then the spool's newest records."""
        try:
            restart.load(self.open, self.state_dir)
            self.seen.read(self.open)
            unreadable = restart.replay(self.open, self.spool)
            self.open.known.clear()
            self.open.known_drivers.clear()
            # the snapshot now holds what the seen log said: the log begins again
            restart.save(restart.parts_of(self.open), self.state_dir)
            self.seen.begin()
            self.open.on_new = self.seen.add
            self.open.on_driver = self.seen.add_driver
        except Exception as exc:  # a damaged snapshot: start with what was read
            self._errors.failed("liveness", exc, "could not read back the open attempts of "
                                "the last run; attempts open before this start are not watched")
            return
        if unreadable:
            self.metrics.worker_errors.inc(unreadable, worker="liveness",
                                           type="unreadable_record")
        if self.open.attempts or self.open.jobs or self.open.actors:
            log.info("watching %d open attempts, %d jobs and %d actors from before this start "
                     "(%d processes)", len(self.open.attempts), len(self.open.jobs),
                     len(self.open.actors), len(self.open.processes))

    # -- the check loop --------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                await self.check()
            except Exception as exc:  # the next check tries again
                self._errors.failed("liveness", exc, "the liveness check failed; it is tried "
                                    "again every %gs", CHECK_INTERVAL_S)

    async def check(self) -> None:
        # /proc and the snapshot's fsync in the loop's own worker threads, not the ingest's
        # decode thread, which a slow disk would otherwise hold up
        loop = asyncio.get_running_loop()
        gone = await loop.run_in_executor(None, procs.gone_of, self.open.living())
        now = time.time_ns()
        self.open.mark_gone(gone, now)
        due = self.open.due(now, self.grace_ns)
        ran = self.open.take_attempts({process.identity.pid for process in due})
        for process in due:  # workers first: their attempts end in their own words
            self._unwritten += self._worker_ends(process, ran.get(process.identity.pid, []))
        for process in due:
            self._unwritten += self._driver_ends(process)
        if self._unwritten:
            await self._write_ends()
        if self.open.changed and time.monotonic() >= self._next_snapshot:
            self.open.changed = False
            self._next_snapshot = time.monotonic() + SNAPSHOT_INTERVAL_S
            await loop.run_in_executor(None, restart.save, restart.parts_of(self.open),
                                       self.state_dir)

    async def _write_ends(self) -> None:
        """Write the ends in spool records of a bounded size; what fails waits for the
        next check."""
        written: list[dict[str, Any]] = []
        try:
            while self._unwritten:
                rows = self._unwritten[:ENDS_PER_RECORD]
                await self.ingestor.ingest_rows(
                    rows, self.ingestor.stamp(os.getpid(), os.getuid()), route="agent")
                del self._unwritten[:len(rows)]
                written += rows
        finally:
            if written:
                self._count(written)

    def _worker_ends(self, process: Process, ran: list[Attempt]) -> list[dict[str, Any]]:
        """The attempts and ops that ran in `process`, and its actors."""
        pid, gone = process.identity.pid, process.gone_ns or time.time_ns()
        rows = []
        for attempt in ran:
            what = "worker" if attempt.ray else "process"
            rows.append(attempt_end(attempt, host=self.host, what=what, pid=pid, gone_ns=gone))
        rows += [actor_end(a, host=self.host, what="worker", pid=pid, gone_ns=gone)
                 for a in self.open.take_actors(pid)]
        return rows

    def _driver_ends(self, process: Process) -> list[dict[str, Any]]:
        """The jobs `process` drove, with what is still open of them."""
        pid, gone = process.identity.pid, process.gone_ns or time.time_ns()
        rows = []
        for job in self.open.take_jobs(pid):
            if not job.ended:
                rows.append(job_end(job, host=self.host, gone_ns=gone))
            rows += [attempt_end(a, host=self.host, what="driver", pid=pid, gone_ns=gone)
                     for a in self.open.take_job_attempts(job)]
            rows += [actor_end(a, host=self.host, what="driver", pid=pid, gone_ns=gone)
                     for a in self.open.take_actors(-1, job)]
        return rows

    def _count(self, rows: Iterable[dict[str, Any]]) -> None:
        kinds: Counter[str] = Counter()
        pids: set[str] = set()
        for row in rows:
            reason = _reason(row)
            self.inferred.inc(kind=row["kind"], reason=reason)
            kinds[row["kind"]] += 1
            pids.add(row["attrs"]["evagg_inferred"].split(" pid ")[1].split()[0])
        said = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in sorted(kinds.items()))
        log.info("inferred the end of %s left open by processes that exited without a "
                 "terminal event (pids %s): each is marked attrs evagg_inferred, and a real "
                 "end arriving later wins", said, ", ".join(sorted(pids, key=int)))

    def _gauges(self) -> list[tuple[str, str, dict[str, str], float]]:
        out = [("evagg_liveness_open", "Open attempts, jobs and actors the agent watches, "
                "and the processes it tracks for them.", {"what": what}, float(n))
               for what, n in (("attempts", len(self.open.attempts)),
                               ("jobs", len(self.open.jobs)),
                               ("actors", len(self.open.actors)),
                               ("processes", len(self.open.processes)))]
        out += [("evagg_liveness_untracked_total", "Starts the agent could not watch, by "
                 "reason (not_visible: no such process here; too_many_*: over the bound).",
                 {"reason": reason}, float(n))
                for reason, n in sorted(self.open.untracked.counts.items())]
        return out


def _reason(row: dict[str, Any]) -> str:
    if row["source"] == "evagg" and row.get("error_type") == "PROCESS_EXITED":
        return "process_exited"
    text = row["attrs"]["evagg_inferred"]
    return "driver_gone" if " driver pid " in text else "worker_gone"
