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


def sink_help(sink: Sink, name: str, generic: str) -> str:
    """The HELP of a sink's own count or value `name` (without `_total`): the sink's own
    words for it (`Sink.metric_help`), else the generic ones."""
    try:
        said = sink.metric_help.get(name)
    except Exception:  # a sink's bad table must not break /metrics or the heartbeat
        return generic
    return f"{said}; by sink and type." if isinstance(said, str) and said else generic


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
        out.append(("evagg_sink_attempt_started_timestamp_seconds",
                    "When the sink's running delivery attempt (a write or a flush: an upload, "
                    "a batch of requests) began, Unix time; 0 while none runs, by sink.",
                    {"sink": name}, consumer.progress.attempt_started_at))
        out.append(("evagg_sink_delivered_events_per_second",
                    "Events the sink delivered per second over the last minute, by sink.",
                    {"sink": name}, consumer.progress.events_per_second()))
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
            help_text = sink_help(sink, count.name, SINK_COUNT_HELP)
            out.append((f"evagg_sink_{count.name}_total", help_text, labels,
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
        return [(f"evagg_sink_{gauge}", sink_help(sink, gauge, SINK_GAUGE_HELP),
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
