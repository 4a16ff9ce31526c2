"""The agent's heartbeat: an `agent` event with the agent's counters as the agent starts
and then every `heartbeat_interval`, with a `loss` event for each reason the agent lost
events since the last one (aggregator/losses.py).

Heartbeats go through the ingestor like any producer's events (route "agent"), so every
sink gets them and the dashboard's node view works after the cluster is gone. Each says
how long readers may go without one before they take the node for dead (attrs
`silent_after_s`: three beats plus the slowest roll of the agent's Parquet sinks, the
time a heartbeat may wait before a reader can see it); readers then end the attempts
left open on it (dashboard/sql/ends.sql). Each also says when its agent process started
(attrs `started_at`), so readers count a restart whatever the counters did.

The first, the start heartbeat, is written once the spool is open, the sinks started and
the socket and port open (a start that fails leaves none), before the agent says it is
ready: readers see a new node, or an agent back after a restart, within a roll of its
sinks instead of an interval later.
It is an ordinary RUNNING heartbeat: nothing else marks it, since its new `started_at`
already tells readers that another agent process began (docs/queries.md, Agents).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aggregator.config import AgentConfig
from aggregator.ingest.ingestor import Ingestor, SpoolUnavailable
from aggregator.losses import LossRecorder, ProducerLoss
from aggregator.metrics import AgentMetrics
from aggregator.worker_errors import WorkerErrors
from emitters.ids import new_event_id

log = logging.getLogger("evagg.agent")
SILENT_BEATS = 3  # heartbeats a reader may miss before it takes the node for dead
LOSS_REPORT_AFTER_S = 1.0  # a loss found is reported this long after, with the rest of its burst
FINAL_TIMEOUT_S = 2.0  # the last heartbeat must not hold the exit (a full spool, `block`)
START_TIMEOUT_S = 2.0  # nor the first one the start


class Heartbeat:
    def __init__(self, ingestor: Ingestor, metrics: AgentMetrics, losses: LossRecorder, *,
                 node_id: str, spool_directory: Path, interval_s: float,
                 silent_after_s: float | None = None) -> None:
        self.ingestor = ingestor
        self.metrics = metrics
        self._errors = WorkerErrors(metrics, log)
        self.losses = losses
        self.node_id = node_id
        self.spool_directory = spool_directory
        self.interval_s = interval_s
        self.silent_after_s = (silent_after_s if silent_after_s is not None
                               else SILENT_BEATS * interval_s)
        # One per agent process: a new one in the next beat is a restart (agents.sql).
        self.started_at = datetime.now(UTC).isoformat(timespec="microseconds")

    async def run(self) -> None:
        """Write one every `interval_s` until cancelled, and a loss found in between within
        a second (at most one such report a second); a failure is counted and logged."""
        loop = asyncio.get_running_loop()
        found = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(found.set)

        self.losses.on_found = wake
        next_beat = loop.time() + self.interval_s
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(next_beat):
                        await found.wait()
                        await asyncio.sleep(LOSS_REPORT_AFTER_S)  # the rest of a burst too
                found.clear()
                beat = loop.time() >= next_beat
                if beat:
                    next_beat = loop.time() + self.interval_s
                await self._write_counted(losses_only=not beat)
        finally:
            self.losses.on_found = None

    async def _write_counted(self, *, losses_only: bool) -> None:
        try:
            if losses_only:
                await self.write_losses()
            else:
                await self.write(final=False)
        except Exception as exc:  # a heartbeat must never end the agent
            self._errors.failed("heartbeat", exc, "the heartbeat was not written; the "
                                "next one is due in %gs", self.interval_s)

    async def write_start(self) -> None:
        """The start heartbeat: best effort, within START_TIMEOUT_S (a spool left full,
        `block`); a failure is counted and logged, and the agent starts all the same."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await self.write(final=False)
        except TimeoutError:
            log.warning("start heartbeat not written: the spool had no room for it within "
                        "%.1fs; readers see this agent with its next heartbeat, due in %gs",
                        START_TIMEOUT_S, self.interval_s)
        except Exception as exc:  # a heartbeat must never end the agent
            self._errors.failed("heartbeat", exc, "the start heartbeat was not written; the "
                                "next one is due in %gs", self.interval_s)

    async def write_final(self, limit_s: float = FINAL_TIMEOUT_S) -> None:
        """The STOPPING heartbeat: best effort, within `limit_s` and FINAL_TIMEOUT_S."""
        wait_s = min(FINAL_TIMEOUT_S, limit_s)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
            # cancellation that a second Ctrl-C sends, and the stop would wait the drain out.
            async with asyncio.timeout(wait_s):
                await self.write(final=True)
        except TimeoutError:
            log.warning("final heartbeat not written: the spool had no room for it within "
                        "%.1fs; readers take this agent's stop from its silence instead", wait_s)
        except (SpoolUnavailable, RuntimeError) as exc:
            log.warning("final heartbeat not written: %s", str(exc) or type(exc).__name__)

    async def write_losses(self) -> None:
        """The `loss` events found since the last report, without a heartbeat."""
        await self._write([])

    async def write(self, *, final: bool) -> None:
        await self._write([self._heartbeat_row(final)])

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        await self._write_producers_reports()
        losses = self.losses.take_unreported()
        for reason, events in losses.items():
            total = self.losses.reported_total(reason) + events
            rows.append(loss_row(reason, events, total, self.node_id))
        if not rows:
            return
        try:
            await self.ingestor.ingest_rows(rows, self.ingestor.stamp(os.getpid(), os.getuid()),
                                            route="agent")
        except BaseException:
            self.losses.return_unreported(losses)  # reported with the next heartbeat instead
            raise
        self.losses.reported(losses)

    async def _write_producers_reports(self) -> None:
        """Producers' reports of their drops that reached the agent in frames it could not
        store (`unstored_at_stop`): written as the producer's own `loss` rows, stamped
        with its pid, so readers count them as that producer's drops, not the agent's."""
        by_pid: dict[int | None, list[ProducerLoss]] = {}
        for pid, report in self.losses.take_unreported_reports():
            by_pid.setdefault(pid, []).append(report)
        while by_pid:
            pid, theirs = next(iter(by_pid.items()))
            rows = [producer_loss_row(report, self.node_id) for report in theirs]
            try:  # route "agent": the ingestor counts no loss rows of this route
                await self.ingestor.ingest_rows(rows, self.ingestor.stamp(pid), route="agent")
            except BaseException:  # written with the next heartbeat instead
                self.losses.return_unreported_reports(
                    [(sender, report) for sender, left in by_pid.items() for report in left])
                raise
            del by_pid[pid]
            # counted once written, as the agent's own losses are; a report the socket
            # counted already (its frame was being stored) adds nothing: its running total
            self.losses.count_from_producers(theirs)

    def _heartbeat_row(self, final: bool) -> dict[str, Any]:
        return {
            "event_id": new_event_id(), "kind": "agent", "source": "evagg",
            "name": "heartbeat", "state": "STOPPING" if final else "RUNNING",
            "node_id": self.node_id, "metrics": self.metrics.registry.snapshot(),
            "attrs": {"version": _version(), "spool": str(self.spool_directory),
                      "heartbeat_interval_s": f"{self.interval_s:g}",
                      "silent_after_s": f"{self.silent_after_s:g}",
                      "started_at": self.started_at},
        }


def silent_after_s(config: AgentConfig) -> float:
    """How long readers may see no heartbeat of this agent before they take its node for
    dead: SILENT_BEATS beats, plus the slowest roll of its Parquet sinks (a heartbeat
    waits in the open file until the file rolls)."""
    from sinks.parquet.options import ParquetOptions

    rolls = [0.0]
    for sink in config.sinks:
        if sink.type == "parquet":
            try:
                rolls.append(ParquetOptions.from_table(sink.options, sink.url).roll_interval_s)
            except ValueError:  # refused when the sink is built, with its reason
                continue
    return SILENT_BEATS * config.heartbeat_interval_s + max(rolls)


def loss_row(reason: str, events: int, total: int, node_id: str) -> dict[str, Any]:
    """`events` lost since the last report; `events_total` since the agent started, so a
    reader still learns the full count when `drop_oldest` dropped an earlier loss event."""
    return {"kind": "loss", "source": "evagg", "name": reason, "state": "DROPPED",
            "node_id": node_id,
            "metrics": {"events": float(events), "events_total": float(total)},
            "attrs": {"reason": reason}}


def producer_loss_row(report: ProducerLoss, node_id: str) -> dict[str, Any]:
    """A producer's `loss` event as its emitter sent it (docs/wire-protocol.md#losses)."""
    metrics = {"events": float(report.events)}
    if report.total is not None:
        metrics["events_total"] = float(report.total)
    attrs = {"reason": report.reason, "component": "emitter"}
    if report.session:
        attrs["session"] = report.session
    ids = {"job_id": report.job_id, "run_id": report.run_id}
    return {"kind": "loss", "source": "evagg", "name": report.reason, "state": "DROPPED",
            "node_id": node_id, "metrics": metrics, "attrs": attrs,
            **{field: value for field, value in ids.items() if value}}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("evagg")
    except PackageNotFoundError:
        return "dev"
