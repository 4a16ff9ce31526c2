"""Every event the agent knows was lost, by reason: the one owner of those counts.

Four places learn of losses and each is given the same `LossRecorder`:

- the spool: `drop_oldest` (full under that policy) and `corrupt_record` (damaged
  records cut at recovery);
- the record screen: `undecodable_record` (a record no sink can read);
- the heartbeat, which turns those into `loss` events within a second and, once they are
  spooled, counts them in `evagg_dropped_events_total{reason}` (so the metric and the
  `loss` events in the lake always agree);
- the ingest routes, for the losses producers report in their own `loss` events
  (`buffer_full`, `nacked`, `too_large`, `unencodable`, `exit_deadline`;
  docs/wire-protocol.md): counted in `evagg_producer_dropped_events_total{reason}`.

A stopping agent may hold such reports in frames of an exited producer that it could not
store (`unstored_at_stop`): those stay the producer's drops. The heartbeat writes them as
the producer's `loss` rows (its pid, session, job and run ids and running total) and
only then counts them as the producer's; a stop that cannot write them keeps them for the
next start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from aggregator.metrics import Family

log = logging.getLogger("evagg.losses")

# What an emitter's `loss` event may name (emitters/ledger.py); any other name is a
# producer's own, counted as "other" so that no producer can grow the label set.
EMITTER_REASONS: Final = frozenset(
    {"buffer_full", "nacked", "too_large", "unencodable", "exit_deadline"})
OTHER_REASON: Final = "other"
KEPT_TOTALS: Final = 100_000  # producer sessions' running totals kept; the longest unseen go first
# Frames of a producer that had exited, still waiting for spool room when the agent
# stopped: nobody can send them again (docs/wire-protocol.md, "A producer that goes away").
UNSTORED_AT_STOP: Final = "unstored_at_stop"
# The agent's own reasons for a lost event (the spool's, the record screen's, the socket's).
AGENT_REASONS: Final = frozenset({"drop_oldest", "corrupt_record", "undecodable_record",
                                  UNSTORED_AT_STOP})
# In the state directory: losses found but not reported when the agent last stopped.
UNREPORTED_FILE: Final = "losses-unreported.json"


class LossRecorder:
    def __init__(self, reported: Family | None = None,
                 producers: Family | None = None) -> None:
        # evagg_dropped_events_total: the agent's losses whose `loss` event is spooled
        self._reported = reported or Family("evagg_dropped_events_total", "", "counter")
        # evagg_producer_dropped_events_total: losses producers reported
        self._producers = producers or Family("evagg_producer_dropped_events_total", "", "counter")
        # Each known reason has a sample from the start, at 0: a first loss is then an
        # increase that rate() and increase() see, where a series that appears with its
        # first value would keep the documented alerts silent (docs/metrics.md).
        for reason in AGENT_REASONS:
            self._reported.inc(0, reason=reason)
        for reason in (*EMITTER_REASONS, OTHER_REASON):
            self._producers.inc(0, reason=reason)
        self._found: dict[str, int] = {}
        self._totals: dict[tuple[str, str], int] = {}  # (session, reason) -> last total seen
        self._unreported: dict[str, int] = {}
        # producers' reports found in frames never stored, with the pid that sent them
        self._unreported_reports: list[tuple[int | None, ProducerLoss]] = []
        # Called (from any thread) when a loss is found, so that the heartbeat reports it
        # within a second instead of at its next beat: until then `evagg status` says
        # "lost none".
        self.on_found: Callable[[], None] | None = None

    def record(self, reason: str, events: int) -> None:
        """A loss the agent found itself; the heartbeat reports it soon."""
        if events > 0:
            self._found[reason] = self._found.get(reason, 0) + events
            self._unreported[reason] = self._unreported.get(reason, 0) + events
            if self.on_found is not None:
                self.on_found()

    def record_unstored_reports(self, pid: int | None, reports: Iterable[ProducerLoss]) -> None:
        """A producer's own loss reports, in its frames the agent stops before storing:
        the heartbeat writes them as that producer's `loss` rows soon."""
        found = [(pid, report) for report in reports]
        if found:
            self._unreported_reports += found
            if self.on_found is not None:
                self.on_found()

    def take_unreported_reports(self) -> list[tuple[int | None, ProducerLoss]]:
        """Producers' reports not yet written, each with its pid; resets them."""
        taken, self._unreported_reports = self._unreported_reports, []
        return taken

    def return_unreported_reports(self, reports: list[tuple[int | None, ProducerLoss]]) -> None:
        """Reports taken but not written after all: written again next time."""
        self._unreported_reports[:0] = reports

    def keep_unreported(self, state_dir: Path) -> None:
        """At exit: the losses no `loss` event reported yet (the spool had no room for the
        last one), written for the next start to report. Never raises: the agent is
        stopping, and the log says what the file would have."""
        if not self._unreported and not self._unreported_reports:
            return
        path = state_dir / UNREPORTED_FILE
        kept = {"agent": self._unreported,
                "producers": [[pid, *report] for pid, report in self._unreported_reports]}
        try:
            staged = path.with_suffix(".tmp")
            staged.write_bytes(orjson.dumps(kept))
            staged.replace(path)
        except OSError as exc:
            lost = {**self._unreported}
            for _, report in self._unreported_reports:
                lost[report.reason] = lost.get(report.reason, 0) + report.events
            log.error("could not keep the count of %s lost events for the next start (%s): "
                      "they were lost by %s", sum(lost.values()), exc, ", ".join(sorted(lost)))

    def recall_unreported(self, state_dir: Path) -> int:
        """At start: what the last run found lost and could not report, reported now;
        returns the events."""
        path = state_dir / UNREPORTED_FILE
        try:
            found = orjson.loads(path.read_bytes())
            path.unlink()
        except FileNotFoundError:
            return 0
        except (OSError, orjson.JSONDecodeError) as exc:
            log.error("could not read the losses the last run left in %s (%s); its log "
                      "has them", path, exc)
            with contextlib.suppress(OSError):  # said once, not at every start
                path.unlink()
            return 0
        if not isinstance(found, dict):
            return 0
        # {"agent": {reason: events},
        #  "producers": [[pid, reason, events, session, total, job_id, run_id]]};
        # a file of an older agent is the agent's {reason: events} alone
        agents = found.get("agent", {}) if "producers" in found else found
        events = 0
        for reason, count in agents.items() if isinstance(agents, dict) else ():
            if isinstance(count, int) and count > 0:
                self.record(str(reason), count)
                events += count
        producers = found.get("producers")
        for item in producers if isinstance(producers, list) else ():
            if (kept := _kept_report(item)) is not None:
                self.record_unstored_reports(kept[0], [kept[1]])
                events += kept[1].events
        return events

    def totals(self) -> dict[str, int]:
        """Events the agent found lost since it started, by reason (reported or not)."""
        return dict(self._found)

    def take_unreported(self) -> dict[str, int]:
        """Losses found and not yet in a `loss` event, by reason; resets them."""
        taken, self._unreported = self._unreported, {}
        return taken

    def return_unreported(self, losses: Mapping[str, int]) -> None:
        """Losses taken but not written after all: they are reported again next time."""
        for reason, events in losses.items():
            self._unreported[reason] = self._unreported.get(reason, 0) + events

    def reported(self, losses: Mapping[str, int]) -> None:
        """The `loss` events for `losses` are spooled: count them on /metrics."""
        for reason, events in losses.items():
            self._reported.inc(events, reason=reason)

    def reported_total(self, reason: str) -> int:
        """Events of `reason` in the `loss` events spooled since the agent started."""
        return int(self._reported.get(reason=reason))

    def record_from_producers(self, batch: pa.RecordBatch) -> None:
        """Count the losses that producers' `loss` events in a spooled batch report."""
        self.count_from_producers(reported_losses(batch))

    def count_from_producers(self, losses: Iterable[ProducerLoss]) -> None:
        """The same, from `reported_losses` of the batch (read off the event loop). A
        report with its session's total counts what that total adds to the last one seen
        (a report the agent never read is made up for by the next, and a resent one adds
        nothing); the first of a session, or one without a total, counts its events."""
        for loss in losses:
            events = loss.events
            if loss.session and loss.total is not None:
                key = (loss.session, loss.reason)
                last = self._totals.pop(key, None)
                if last is not None:
                    events = max(0, loss.total - last)
                self._totals[key] = max(loss.total, last or 0)  # newest last
                if len(self._totals) > KEPT_TOTALS:
                    del self._totals[next(iter(self._totals))]
            if events > 0:
                self._producers.inc(events, reason=loss.reason)


class ProducerLoss(NamedTuple):
    """One `loss` event of a producer: its reason, count, session and running total."""

    reason: str
    events: int
    session: str  # attrs.session, the emitter's; "" where a producer sends none
    total: int | None  # metrics.events_total: the session's drops for the reason so far
    # whose work was lost, as the producer's emitter stamps its events ("": none)
    job_id: str = ""
    run_id: str = ""


def reported_losses(batch: pa.RecordBatch) -> list[ProducerLoss]:
    """The `loss` events in `batch` (`name` the reason, `metrics.events` the count). Most
    batches hold none: one vectorised compare."""
    is_loss = pc.equal(batch.column("kind"), "loss")
    if not pc.any(is_loss).as_py():
        return []
    losses = batch.filter(is_loss)
    out: list[ProducerLoss] = []
    columns = (losses.column(name).to_pylist()
               for name in ("name", "metrics", "attrs", "job_id", "run_id"))
    for name, metrics, attrs, job_id, run_id in zip(*columns, strict=True):
        values, labels = dict(metrics or []), dict(attrs or [])
        events = int(values.get("events") or 0)
        total = values.get("events_total")
        out.append(ProducerLoss(name if name in EMITTER_REASONS else OTHER_REASON, events,
                                str(labels.get("session") or ""),
                                int(total) if total is not None else None,
                                job_id or "", run_id or ""))
    return [loss for loss in out if loss.events > 0 or loss.total is not None]


def _kept_report(item: object) -> tuple[int | None, ProducerLoss] | None:
    """A producer's report as keep_unreported wrote it, [pid, reason, events, session,
    total, job_id, run_id] (an older agent's without the ids); None for anything else
    (the file was edited or damaged)."""
    if not isinstance(item, list) or len(item) not in (5, 7):
        return None
    pid, reason, events, session, total, *ids = item
    if (not isinstance(pid, int | None) or not isinstance(reason, str)
            or not isinstance(events, int) or not isinstance(session, str)
            or not isinstance(total, int | None)
            or not all(isinstance(one, str) for one in ids)):
        return None
    return pid, ProducerLoss(reason if reason in EMITTER_REASONS else OTHER_REASON, events,
                             session, total, *ids)
