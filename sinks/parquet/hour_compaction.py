"""Merging the hours a Parquet sink has moved past, in the background.

Files roll every few seconds so that an event is visible soon after it is sent; left
alone, that is 720 small files an hour on every node, and every reader pays for each of
them. Once an hour has been closed for `after_s` (the same grace `evagg compact` gives a
file a retrying agent might still rewrite), this merges that hour's files of this node
with `evagg compact`'s own machinery (sinks/parquet/compact.py): one file per hour and
node, one row per event_id, the inputs deleted only after the merged file is in place.

It runs in a daemon thread of its own, one hour at a time, so a slow bucket never holds
back delivery and an agent that stops does not wait for it (a merge cut short is cleaned
up by the next run: the cover list in the merged file says what it replaced). A failure is
counted by kind, logged once, and the hour is tried again at the next due time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from emitters.thread_names import name_this_thread
from sinks.base import SinkCounter
from sinks.locations import is_s3_url
from sinks.parquet.compact import run_compact
from sinks.parquet.compact_targets import remove_leftover_scratch
from sinks.parquet.layout import node_directory, partition_for
from sinks.parquet.options import S3Options

log = logging.getLogger("evagg.sinks.parquet.merge")

_HOUR_S: Final = 3600
RECENT_HOURS: Final = 24  # after a restart, the hours looked at again
# what each of the counts below measures (Sink.metric_help)
METRIC_HELP: Final[Mapping[str, str]] = {
    "compaction_runs": "Merges of closed hours the agent ran",
    "compacted_files": "Files the agent merged into one file per closed hour",
    "compaction_failures": "Closed hours that could not be merged, by reason; tried again "
                           "compact_after later",
    "partitions_not_merged": "Closed hours (partitions) whose last merge failed, waiting to be "
                             "tried again",
}
QUIET_S: Final = 60.0  # at least this long without a file before the latest hour is merged


class HourCompaction:
    """One per Parquet sink: which closed hours are due, and the thread that merges them."""

    def __init__(self, location: str, node_id: str, *, s3: S3Options, after_s: float,
                 scratch_dir: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.location = location
        # an S3 hour's inputs and merged file before upload, and any hour's fold spill
        self.scratch_dir = scratch_dir
        self._swept = scratch_dir is None  # its leftovers from earlier runs, once
        self.node_id = node_id
        self.s3 = s3
        self.after_s = after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._due_at: dict[str, float] = {}  # partition -> when it may be merged
        self._running: threading.Thread | None = None
        self._stopped = False
        self.runs = 0
        self.merged_files = 0
        self.failures: Counter[str] = Counter()
        self._not_merged: set[str] = set()  # hours whose last merge failed
        self._writing_hour_ns = 0  # the latest hour the sink has put a file in
        self._last_file_at = 0.0  # when it did (the clock's time)

    def file_published(self, received_ns: int) -> None:
        """The sink put a file in the hour of this receive time: merge that hour once it
        has been closed long enough."""
        hour_start = received_ns // 1_000_000_000 // _HOUR_S * _HOUR_S
        with self._lock:
            self._writing_hour_ns = max(self._writing_hour_ns, hour_start * 1_000_000_000)
            self._last_file_at = self._clock()
            self._due_at.setdefault(partition_for(received_ns), hour_start + _HOUR_S + self.after_s)

    def poke(self) -> None:
        """Start merging the hours that are due, unless a merge is running. Cheap: the
        sink calls this on every flush."""
        with self._lock:
            if self._stopped or (self._running is not None and self._running.is_alive()):
                return
            due = self._due_hours(self._clock())
            if not due:
                return
            for partition in due:
                del self._due_at[partition]
            self._running = threading.Thread(target=self._merge_all, args=(due,),
                                             name="evagg-hour-compaction", daemon=True)
            self._running.start()

    def _due_hours(self, now: float) -> list[str]:
        """The hours due now, oldest first; the lock is held. Not the hour the sink still
        writes (a backlog being replayed), whose next file would only make the merge run
        again; once the sink has been quiet for a while (an idle node, a filtered sink)
        that hour is merged too."""
        quiet = now - self._last_file_at >= max(self.after_s, QUIET_S)
        writing = None if quiet or not self._writing_hour_ns else partition_for(
            self._writing_hour_ns)
        return sorted(p for p, at in self._due_at.items() if at <= now and p != writing)

    def _merge_all(self, partitions: list[str]) -> None:
        # Every hour due when poked, one after the other: after a restart the 24 hours
        # looked at again are mostly one listing each, and need not wait for a flush
        # apiece. A failed hour is due again later, at a poke of its own.
        name_this_thread()  # "evagg-hour-com" in `top -H`: the merge and its fragment
        self._remove_leftovers()
        for partition in partitions:
            with self._lock:
                if self._stopped:
                    return
            self._merge(partition)

    def _remove_leftovers(self) -> None:
        """Once, before this process's first merge: what a merge cut short by a kill left
        in the scratch directory (an hour's files, a fold's spill), which nothing else
        deletes."""
        if self._swept or self.scratch_dir is None:
            return
        self._swept = True
        try:
            removed = remove_leftover_scratch(self.scratch_dir)
        except OSError as exc:
            log.warning("could not remove the hour merges' leftovers in %s: %s",
                        self.scratch_dir, exc)
            return
        if removed:
            log.info("deleted %d folders an earlier run's hour merges left in %s",
                     removed, self.scratch_dir)

    def stop(self) -> None:
        """No new merges; one already running finishes on its own."""
        with self._lock:
            self._stopped = True

    def wait_idle(self, timeout_s: float) -> bool:
        """For tests and benchmarks: whether no merge runs now (waiting up to timeout_s)."""
        running = self._running
        if running is not None:
            running.join(timeout_s)
        return running is None or not running.is_alive()

    def gauges(self) -> dict[str, float]:
        """How many closed hours wait after a failed merge: a count of failures goes on
        growing, this falls back to 0 once they are merged."""
        with self._lock:
            return {"partitions_not_merged": float(len(self._not_merged))}

    def counters(self) -> list[SinkCounter]:
        out = [SinkCounter("compaction_runs", self.runs),
               SinkCounter("compacted_files", self.merged_files)]
        return out + [SinkCounter("compaction_failures", n, kind)
                      for kind, n in sorted(self.failures.items())]

    def _merge(self, partition: str) -> None:
        if not is_s3_url(self.location) and not Path(self.location).expanduser().is_dir():
            return  # nothing written yet
        try:
            report = run_compact(
                self.location, partition=f"{partition}/{node_directory(self.node_id)}",
                grace_s=self.after_s, endpoint_url=self.s3.endpoint_url, region=self.s3.region,
                path_style=self.s3.path_style, upload_args=dict(self.s3.upload_args),
                scratch_dir=self.scratch_dir)
            self.runs += 1
            self.merged_files += report.merged_files
            if report.errors:
                kind = next(p.error_kind for p in report.partitions if p.error)
                self._failed(kind, "; ".join(report.errors), partition)
                return
            with self._lock:
                self._not_merged.discard(partition)
            if any(p.young for p in report.partitions):
                # files younger than the grace (a replayed backlog written into this old
                # hour just now) wait for a later merge of the hour, not for a restart
                with self._lock:
                    self._due_at.setdefault(partition, self._clock() + self.after_s)
        except Exception as exc:  # a background worker: count, log once, try again later
            self._failed(type(exc).__name__.lower()[:40], repr(exc), partition)

    def _failed(self, kind: str, detail: str, partition: str) -> None:
        kind = "".join(c if c.isalnum() else "_" for c in kind) or "error"
        self.failures[kind] += 1
        if self.failures[kind] == 1:
            log.warning("merging the closed hour %s of %s failed (%s): %s; it is tried again "
                        "in %.0fs", partition, self.location, kind, detail[:300], self.after_s)
        with self._lock:
            self._not_merged.add(partition)
            self._due_at.setdefault(partition, self._clock() + self.after_s)

    def look_back(self, hours: int = RECENT_HOURS) -> None:
        """After a start the sink does not know which earlier hours it wrote: look at the
        last `hours` closed ones again, `after_s` from now (a merged hour is one listing)."""
        now = self._clock()
        this_hour = int(now) // _HOUR_S * _HOUR_S
        with self._lock:
            for back in range(1, hours + 1):
                start = this_hour - back * _HOUR_S
                self._due_at.setdefault(partition_for(start * 1_000_000_000), max(
                    start + _HOUR_S + self.after_s, now + self.after_s))
