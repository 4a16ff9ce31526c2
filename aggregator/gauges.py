"""The agent's sampled metrics: spool use, uptime, each sink's lag and its own counts.

These are read when /metrics is scraped (and for each heartbeat), not kept as counters:
the spool and the sinks own the numbers, this module only names them. Names and labels
are listed in docs/metrics.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from aggregator.delivery.consumer import SinkConsumer
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool
from aggregator.worker_errors import WorkerErrors
from sinks.base import Sink

log = logging.getLogger("evagg.metrics")

Sample = tuple[str, str, dict[str, str], float]

SPOOL_COUNTER_HELP: Final = ("Spool counters since start (records, duplicates, corrupt records, "
                             "quarantined segments, fsyncs).")
SINK_COUNT_HELP: Final = "A sink's own count since it was built, by sink and type."
SINK_GAUGE_HELP: Final = "A sink's own value now, by sink and type."
# What each of the sinks' own counts and values is, for /metrics' HELP: what a dashboard
# builder reads in the metric browser (the long form, with what to do: docs/metrics.md).
# A name not here gets the generic words above.
SINK_METRIC_HELP: Final = {
    "files_written": "Parquet files published under their final key (on S3: uploaded)",
    "bytes_written": "Bytes of the Parquet files published",
    "events_written": "Rows in the Parquet files published",
    "write_failures": "Parquet files that could not be built, by reason",
    "publish_failures": "Finished Parquet files that could not be uploaded or renamed into "
                        "the lake, by reason; the spool keeps their events",
    "compaction_runs": "Merges of closed hours the agent ran",
    "compacted_files": "Files the agent merged into one file per closed hour",
    "compaction_failures": "Closed hours that could not be merged, by reason; tried again "
                           "compact_after later",
    "s3_puts": "Files uploaded to S3 in one PutObject",
    "s3_multipart_uploads": "Files uploaded to S3 in parts",
    "s3_aborted_uploads": "Multipart uploads aborted after a failure",
    "s3_abort_failures": "Aborts of multipart uploads that failed (tried again before the "
                         "next upload)",
    "s3_swept_uploads": "Multipart uploads a crashed agent left, aborted at the first upload",
    "s3_retries": "botocore's own retries of S3 calls that got an answer",
    "requests_2xx": "HTTP requests answered 2xx",
    "requests_3xx": "HTTP requests answered 3xx",
    "requests_4xx": "HTTP requests answered 4xx",
    "requests_5xx": "HTTP requests answered 5xx",
    "requests_failed": "HTTP requests without an answer, whatever the cause",
    "timeouts": "HTTP requests that timed out",
    "connect_errors": "HTTP requests that could not connect",
    "tls_errors": "HTTP requests that failed in TLS",
    "internal_errors": "HTTP requests that failed inside the sink",
    "retries": "HTTP batches sent again",
    "dead_lettered_batches": "HTTP batches refused for good (4xx), kept for evagg dlq replay",
    "dead_lettered_events": "Events refused for good (4xx), kept for evagg dlq replay",
    "split_batches": "HTTP batches refused as too large (413), sent again in halves",
    "bytes_sent": "Request body bytes the endpoint accepted (after gzip)",
    "events_sent": "Events the endpoint accepted",
    "open_file_events": "Events in the Parquet file being written: spooled, not yet in the "
                        "lake",
    "file_closes_in_seconds": "Seconds until the open Parquet file closes and its events "
                              "can be queried (0 with none open)",
    "concurrency_limit": "Requests the HTTP sink may have in flight now (adaptive: follows "
                         "the endpoint up to max_in_flight)",
    "requests_in_flight": "HTTP requests open now",
    "answer_latency_seconds": "Moving average of the endpoint's answer time in seconds, "
                              "request start to last byte (0 before the first answer)",
    "requests_failing_since_timestamp_seconds": "When the HTTP sink's requests began to fail "
                                                "in a row, Unix time (0 while answered)",
    "dead_letters_waiting_events": "Events in the HTTP sink's dead letters on disk, waiting "
                                   "for evagg dlq replay",
    "header_files_unusable": "file: headers whose file is gone, unreadable or empty now",
}


def sink_help(name: str, generic: str) -> str:
    """The HELP of the sinks' own count or value `name` (without `_total`)."""
    said = SINK_METRIC_HELP.get(name)
    return f"{said}; by sink and type." if said else generic
# Before sinks reported through `Sink.counters()`, the HTTP sink's counts were exported
# under this prefix. Dashboards and alerts use them, so they stay beside the new names.
LEGACY_HTTP_PREFIX: Final = "evagg_http_sink_"


class AgentGauges:
    """A gauge source for the agent's registry; `consumers()` gives the sinks running now
    (a reload replaces them)."""

    def __init__(self, metrics: AgentMetrics, spool: Spool,
                 consumers: Callable[[], Mapping[str, SinkConsumer]]) -> None:
        self.metrics = metrics
        self._errors = WorkerErrors(metrics, log)
        self.spool = spool
        self.consumers = consumers
        self.started_ns = time.time_ns()

    def sample(self) -> list[Sample]:
        out = self._spool_samples()
        for name, consumer in self.consumers().items():
            out += self._delivery_samples(name, consumer)
            out += self._sink_count_samples(name, consumer.sink)
        return out

    def _spool_samples(self) -> list[Sample]:
        out: list[Sample] = [
            ("evagg_spool_bytes", "Bytes held in the spool.", {}, float(self.spool.bytes_used)),
            ("evagg_spool_max_bytes", "The spool's byte cap.", {}, float(self.spool.max_bytes)),
            ("evagg_uptime_seconds", "Seconds since the agent started.", {},
             (time.time_ns() - self.started_ns) / 1e9),
            ("evagg_spool_blocked", "1 while new events wait for room in a full spool "
             "(when_full = \"block\"), else 0.", {}, 1.0 if self.spool.blocked else 0.0),
        ]
        out += [("evagg_spool_totals", SPOOL_COUNTER_HELP, {"total": counter}, float(count))
                for counter, count in self.spool.counters.items()]
        failing = self.metrics.spool_write_failing_since
        failing.clear()
        if (failure := self.spool.write_failure) is not None:  # alerts fire on its presence
            failing.set(failure.since, reason=failure.reason)
        return out

    def _delivery_samples(self, name: str, consumer: SinkConsumer) -> list[Sample]:
        out: list[Sample] = []
        out.append(("evagg_sink_last_delivery_timestamp_seconds",
                    "When the sink last delivered (before its first delivery: when it was "
                    "started), by sink; alert on time() - this while its lag is above 0.",
                    {"sink": name}, consumer.state.last_success_ns / 1e9))
        records, events = self.spool.lag(name)
        out.append(("evagg_sink_lag_events", "Events spooled but not yet delivered, by sink.",
                    {"sink": name}, float(events)))
        out.append(("evagg_sink_lag_records", "Spool records not yet delivered, by sink.",
                    {"sink": name}, float(records)))
        return out

    def _sink_count_samples(self, name: str, sink: Sink) -> list[Sample]:
        """`evagg_sink_<count>_total{sink, type[, reason]}` for every count the sink reports."""
        try:
            counts = list(sink.counters())
        except Exception as exc:  # a sink bug must not break /metrics or the heartbeat
            self._count_failure(name, exc)
            return []
        out: list[Sample] = []
        for count in counts:
            labels = {"sink": name, "type": sink.sink_type}
            if count.reason is not None:
                labels["reason"] = count.reason
            out.append((f"evagg_sink_{count.name}_total", sink_help(count.name, SINK_COUNT_HELP),
                        labels,
                        float(count.value)))
        if sink.sink_type == "http":
            out += _legacy_http_samples(name, [(c.name, c.value) for c in counts
                                               if c.reason is None])
        return out + self._sink_gauge_samples(name, sink)

    def _sink_gauge_samples(self, name: str, sink: Sink) -> list[Sample]:
        """`evagg_sink_<gauge>{sink, type}` for every value the sink has now."""
        try:
            values = dict(sink.gauges())
        except Exception as exc:  # a sink bug must not break /metrics or the heartbeat
            self._count_failure(name, exc)
            return []
        return [(f"evagg_sink_{gauge}", sink_help(gauge, SINK_GAUGE_HELP),
                 {"sink": name, "type": sink.sink_type}, float(value))
                for gauge, value in values.items()]

    def _count_failure(self, name: str, exc: Exception) -> None:
        self._errors.failed(f"sink:{name}", exc, "sink %s could not report its counters; "
                            "/metrics leaves them out", name)


def _legacy_http_samples(name: str, counts: Iterable[tuple[str, int]]) -> list[Sample]:
    return [(f"{LEGACY_HTTP_PREFIX}{counter}_total",
             f"HTTP sink: {counter.replace('_', ' ')} since start, by sink "
             "(the same as evagg_sink_<counter>_total).", {"sink": name}, float(value))
            for counter, value in counts]
