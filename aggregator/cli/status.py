"""`evagg status`: two scrapes of /metrics turned into rates, lag, spool use and losses."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from aggregator.cli.status_health import by_label, labelled, sink_health
from aggregator.disk_words import what_to_do
from aggregator.log_format import utc_clock

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{a="b"}': value}; comments and bad lines ignored."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match:
            try:
                out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
            except ValueError:
                continue
    return out


def _nonzero(counts: dict[str, float]) -> dict[str, float]:
    """The counts that happened: the agent exports each loss reason at 0 from its start."""
    return {key: value for key, value in counts.items() if value}


@dataclass
class StatusReport:
    received_per_s: float
    delivered_per_s: dict[str, float]
    lag_events: dict[str, float]
    permanent_error: dict[str, float]
    spool_bytes: float
    spool_max_bytes: float
    dropped: dict[str, float]  # by the agent itself (spool policy, damaged records)
    rejected: dict[str, float]
    bad_input: dict[str, float]
    errors: dict[str, float] = field(default_factory=dict)
    health: dict[str, str] = field(default_factory=dict)  # sink -> ok / retrying / failing
    # a Parquet sink's open file: sink -> seconds until it closes and its events are in the lake
    file_closes_in_s: dict[str, float] = field(default_factory=dict)
    # batches a sink sent again itself (the HTTP sink retries a failed batch alone, which
    # the delivery loop's `errors` do not count while the endpoint answers others)
    retried: dict[str, float] = field(default_factory=dict)
    # losses producers reported in their own `loss` events (evagg_producer_dropped_events_total)
    producer_dropped: dict[str, float] = field(default_factory=dict)
    # events an HTTP endpoint refused for good since the agent started
    dead_lettered: dict[str, float] = field(default_factory=dict)
    # of those (and earlier runs'), the events on disk now, not yet sent by `evagg dlq replay`
    dead_letters_waiting: dict[str, float] = field(default_factory=dict)
    # `file:` headers whose file is gone, unreadable or empty: the value before is sent
    header_files_unusable: dict[str, float] = field(default_factory=dict)
    # events producers sent since the agent started (its own heartbeats left out): a
    # rate of 0 right after one test event does not say whether it arrived; this does
    received_total: float = 0.0
    spool_blocked: bool = False  # new events wait for room (when_full = "block")
    # while the spool's appends fail (a full disk before the cap): the error's name -> since
    spool_write_failing: dict[str, float] = field(default_factory=dict)
    draining: bool = False  # the agent is stopping
    # when the last reload (SIGHUP) was refused, while the sinks before it still run
    reload_refused_at: float | None = None
    # a Parquet sink's closed hours whose last merge failed, and its merge failures by reason
    partitions_not_merged: dict[str, float] = field(default_factory=dict)
    merge_failures: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def as_text(self, config_flag: str = "") -> str:
        """The report for people; `config_flag` (` --config FILE`, the one status was
        given) goes into the commands it prints, so that they read this agent's lake and
        dead letters as pasted."""
        used = 100 * self.spool_bytes / self.spool_max_bytes if self.spool_max_bytes else 0.0
        lines = [
            f"received   {self.received_per_s:,.0f} events/s, "
            f"{self.received_total:,.0f} from producers since the agent started",
            f"spool      {self.spool_bytes / 2**20:,.1f} MiB of "
            f"{self.spool_max_bytes / 2**20:,.0f} MiB ({used:.1f}%)",
        ]
        if self.spool_blocked:
            lines.append("           full: new events wait for room (when_full = \"block\"); "
                         "producers buffer, HTTP senders get 503, until the sinks deliver")
        for reason, since in sorted(self.spool_write_failing.items()):
            lines.append(f"           cannot write ({reason}) since {utc_clock(since)}: new "
                         "events wait (producers buffer, HTTP senders get 503); "
                         f"{what_to_do(reason)}")
        if self.draining:
            lines.append("agent      stopping: delivering what is spooled before it exits")
        for sink in sorted(set(self.lag_events) | set(self.delivered_per_s)):
            state = self.health.get(sink, "ok")
            lines.append(f"sink {sink:<12} {_per_s(self.delivered_per_s.get(sink, 0))} events/s  "
                         f"lag {_count(self.lag_events.get(sink, 0), 'event')}{self._file(sink)}  "
                         f"errors {self.errors.get(sink, 0):,.0f}{self._retried(sink)}  "
                         f"{state}{self._dead_letters(sink, config_flag)}"
                         f"{self._header_files(sink)}{self._unmerged(sink)}")
        if self.reload_refused_at:
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.reload_refused_at))
            lines.append(f"config     the reload at {at} was refused (the agent's log says "
                         "why): the sinks above are the configuration before it")
        lines += self._losses(config_flag)
        lines.append("rejected   " + (_pairs(self.rejected) or "none"))
        lines.append("bad input  " + (_pairs(self.bad_input) or "none"))
        return "\n".join(lines)


    def _losses(self, config_flag: str) -> list[str]:
        """Every loss /metrics counts, by whom and why: a producer's drops are as lost
        as the agent's, and after an incident they are the ones to explain."""
        total = sum(self.dropped.values()) + sum(self.producer_dropped.values())
        if not total and (self.spool_blocked or self.spool_write_failing):
            # producers buffer, then drop, and report it in frames that wait for room too
            return ["lost       none counted yet: while the spool is full, producers that run "
                    "out of buffer drop events, and their reports of it wait for room"]
        if not total:
            return ["lost       none"]
        lines = [f"lost       {total:,.0f} events (each loss is also a `loss` row in the lake)"]
        for who, losses in (("by producers", self.producer_dropped),
                            ("by the agent", self.dropped)):
            if any(losses.values()):
                lines.append(f"  {who:<12} " + ", ".join(
                    f"{reason}={count:,.0f} ({LOSS_REASONS.get(reason, 'reported by name')})"
                    for reason, count in sorted(losses.items()) if count))
        if any(self.producer_dropped.values()):
            lines.append(f"  which ones   evagg query{config_flag} sql "
                         f"\"{WHICH_PRODUCERS}\"")
        return lines

    def _dead_letters(self, sink: str, config_flag: str) -> str:
        """Events the endpoint refused for good: not lost, but not delivered either."""
        if sink in self.dead_letters_waiting:  # what is on disk now: a replay empties it
            waiting = self.dead_letters_waiting[sink]
            return (f"  dead letters: {_count(waiting, 'event')} waiting (evagg dlq list"
                    f"{config_flag} --sink {sink})" if waiting else "")
        count = self.dead_lettered.get(sink, 0.0)
        return (f"  dead-lettered {count:,.0f} events since the agent started (evagg dlq list"
                f"{config_flag} --sink {sink})" if count else "")

    def _header_files(self, sink: str) -> str:
        count = self.header_files_unusable.get(sink, 0.0)
        return (f"  {_count(count, 'header file')} gone or unreadable: the value read before "
                "is sent (the agent's log names the file)" if count else "")

    def _unmerged(self, sink: str) -> str:
        """Closed hours left as their small files: readable, but slower to read, and on
        S3 a request per file. Not a loss."""
        hours = self.partitions_not_merged.get(sink, 0.0)
        if not hours:
            return ""
        reasons = _pairs(self.merge_failures.get(sink, {}))
        return (f"  {_count(hours, 'closed hour')} not merged (failures so far: {reasons}; "
                "the agent's log says why, and tries again)")

    def _retried(self, sink: str) -> str:
        count = self.retried.get(sink, 0.0)
        return f"  retried {count:,.0f} batches" if count else ""

    def _file(self, sink: str) -> str:
        """For a Parquet sink with a file open: when its events reach the lake. Not while
        it fails: then its lag waits for the store, not for the file to close."""
        if sink not in self.file_closes_in_s or self.health.get(sink, "ok") != "ok":
            return ""
        return f" (not in a file yet: next file closes in {self.file_closes_in_s[sink]:.0f}s)"


# Why each loss happened, in the words `evagg status` shows (docs/wire-protocol.md#losses,
# docs/spool.md); a reason not here is shown by its name alone.
LOSS_REASONS = {
    "buffer_full": "the producer's queue or buffer was full: agent away or too slow",
    "nacked": "the agent refused the producer's frame; its log says why",
    "too_large": "one event larger than the producer's max_frame_bytes",
    "unencodable": "the producer could not encode the event",
    "exit_deadline": "still unsent when the producer exited",
    "other": "a producer's own reason",
    "drop_oldest": "the spool was full and drops its oldest records (overflow policy)",
    "corrupt_record": "damaged spool records cut when the agent started",
    "undecodable_record": "a spool record no sink can read",
    "unstored_at_stop": "sent by a producer that exited, still waiting for spool room when "
                        "the agent stopped",
}


# Which producers lost events: each `loss` row carries the producer's host and pid,
# stamped by the agent from the socket's peer.
# A producer's reports carry its session's running total, and its last report may repeat
# what an earlier one (still unanswered then) said: each session counts its largest total.
WHICH_PRODUCERS = ("SELECT host, pid, reason, sum(lost) AS events FROM (SELECT host, pid, "
                   "name AS reason, coalesce(max(metrics['events_total']), "
                   "sum(metrics['events'])) AS lost FROM events WHERE kind = 'loss' "
                   "GROUP BY host, pid, name, attrs['session']) GROUP BY ALL "
                   "ORDER BY events DESC")


def _count(n: float, noun: str) -> str:
    """`1 event`, `2 events`, `1,204 events`."""
    return f"{n:,.0f} {noun}{'' if n == 1 else 's'}"


def _per_s(rate: float) -> str:
    """`1,204`, and `0.4` where a whole number would read as nothing delivered."""
    return f"{rate:,.1f}" if 0 < rate < 10 else f"{rate:,.0f}"


def _pairs(values: dict[str, float]) -> str:
    return ", ".join(f"{k or 'total'}={v:,.0f}" for k, v in sorted(values.items()) if v)


def format_status(first: dict[str, float], second: dict[str, float],
                  interval: float, now: float | None = None) -> StatusReport:
    def rate(metric: str, label: str) -> dict[str, float]:
        before, after = by_label(first, metric, label), by_label(second, metric, label)
        return {k: max(0.0, (v - before.get(k, 0.0)) / interval) for k, v in after.items()}

    received = sum(rate("evagg_received_events_total", "route").values())
    return StatusReport(
        received_per_s=received,
        delivered_per_s=_delivered_per_s(second, rate("evagg_delivered_events_total", "sink")),
        lag_events=by_label(second, "evagg_sink_lag_events", "sink"),
        permanent_error=by_label(second, "evagg_sink_permanent_error", "sink"),
        spool_bytes=second.get("evagg_spool_bytes", 0.0),
        spool_max_bytes=second.get("evagg_spool_max_bytes", 0.0),
        dropped=_nonzero(by_label(second, "evagg_dropped_events_total", "reason")),
        rejected=by_label(second, "evagg_rejected_events_total", "route"),
        bad_input=by_label(second, "evagg_bad_input_total", "reason"),
        errors=by_label(second, "evagg_delivery_errors_total", "sink"),
        health=sink_health(second, time.time() if now is None else now),
        file_closes_in_s=_open_files(second),
        retried=by_label(second, "evagg_sink_retries_total", "sink"),
        producer_dropped=_nonzero(by_label(second, "evagg_producer_dropped_events_total",
                                            "reason")),
        dead_lettered=by_label(second, "evagg_sink_dead_lettered_events_total", "sink"),
        dead_letters_waiting=by_label(second, "evagg_sink_dead_letters_waiting_events", "sink"),
        header_files_unusable=by_label(second, "evagg_sink_header_files_unusable", "sink"),
        reload_refused_at=second.get("evagg_config_reload_refused_timestamp_seconds"),
        spool_blocked=bool(second.get("evagg_spool_blocked", 0.0)),
        spool_write_failing=by_label(
            second, "evagg_spool_write_failing_since_timestamp_seconds", "reason"),
        draining=bool(second.get("evagg_draining", 0.0)),
        partitions_not_merged=by_label(second, "evagg_sink_partitions_not_merged", "sink"),
        merge_failures=_by_sink_and_reason(second, "evagg_sink_compaction_failures_total"),
        received_total=sum(v for route, v in by_label(
            second, "evagg_received_events_total", "route").items() if route != "agent"),
    )


def _delivered_per_s(sample: dict[str, float], over_interval: dict[str, float]
                     ) -> dict[str, float]:
    """Each sink's rate over the agent's last minute: a sink delivers in bursts (a file as
    it closes, a batch every batch_interval), which status's own interval sees whole or not
    at all. Over that interval only where the agent has no such gauge (an older agent)."""
    minute = by_label(sample, "evagg_sink_delivered_events_per_second", "sink")
    return {**over_interval, **minute}


def _by_sink_and_reason(sample: dict[str, float], metric: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for labels, value in labelled(sample, metric):
        if value:
            out.setdefault(labels.get("sink", ""), {})[labels.get("reason", "")] = value
    return out


def _open_files(sample: dict[str, float]) -> dict[str, float]:
    open_events = by_label(sample, "evagg_sink_open_file_events", "sink")
    closes_in = by_label(sample, "evagg_sink_file_closes_in_seconds", "sink")
    return {sink: closes_in.get(sink, 0.0) for sink, events in open_events.items() if events}
