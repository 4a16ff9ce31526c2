"""The agent's own counters and gauges, rendered as Prometheus text on /metrics.

Label values are bounded by construction: reasons and error kinds are short fixed
words chosen by the code, sink names come from the config. No secret is ever a label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

LabelKey = tuple[tuple[str, str], ...]


@dataclass
class Family:
    name: str
    help: str
    type: str  # "counter" | "gauge" | "histogram"
    values: dict[LabelKey, float] = field(default_factory=dict)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def clear(self, **labels: str) -> None:
        """Drop every series carrying these labels (a gauge that applies no longer)."""
        wanted = set(labels.items())
        self.values = {key: value for key, value in self.values.items()
                       if not wanted <= set(key)}


GaugeSource = Callable[[], Iterable[tuple[str, str, dict[str, str], float]]]


class Registry:
    """Families by name, plus gauge sources sampled at render time."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self._sources: list[GaugeSource] = []
        self._extra_renderers: list[Callable[[], str]] = []

    def counter(self, name: str, help: str) -> Family:
        return self._family(name, help, "counter")

    def gauge(self, name: str, help: str) -> Family:
        return self._family(name, help, "gauge")

    def _family(self, name: str, help: str, kind: str) -> Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = Family(name, help, kind)
        return family

    def forget(self, **labels: str) -> None:
        """Drop every series of every family carrying these labels: a sink a reload
        removed is no longer listed by /metrics or `evagg status`."""
        for family in self._families.values():
            family.clear(**labels)

    def add_gauge_source(self, source: GaugeSource) -> None:
        """`source()` yields (name, help, labels, value) when /metrics is read; a name
        ending in `_total` is rendered as a counter (a total kept elsewhere)."""
        self._sources.append(source)

    def add_renderer(self, render: Callable[[], str]) -> None:
        """Extra Prometheus text appended to the output (derived metrics)."""
        self._extra_renderers.append(render)

    def snapshot(self) -> dict[str, float]:
        """Flat name{labels} -> value, for heartbeat events and `evagg status`."""
        out: dict[str, float] = {}
        for family in self._families.values():
            for labels, value in family.values.items():
                out[_series(family.name, labels)] = value
        for name, _help, sample_labels, value in self._sampled():
            out[_series(name, tuple(sorted(sample_labels.items())))] = value
        return out

    def render(self) -> str:
        lines: list[str] = []
        sampled = self._sampled()  # first: a source may set a family's value for this render
        for family in self._families.values():
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.type}")
            for labels, value in sorted(family.values.items()):
                lines.append(f"{_series(family.name, labels)} {_number(value)}")
        seen: set[str] = set()
        for name, help, sample_labels, value in sampled:
            if name not in seen:  # a sampled *_total only ever grows: a counter
                lines.append(f"# HELP {name} {help}")
                lines.append(f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}")
                seen.add(name)
            series = _series(name, tuple(sorted(sample_labels.items())))
            lines.append(f"{series} {_number(value)}")
        text = "\n".join(lines) + "\n"
        for render in self._extra_renderers:
            text += render()
        return text

    def _sampled(self) -> list[tuple[str, str, dict[str, str], float]]:
        out: list[tuple[str, str, dict[str, str], float]] = []
        for source in self._sources:
            out.extend(source())
        return sorted(out, key=lambda item: item[0])


def _series(name: str, labels: LabelKey) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class AgentMetrics:
    """The counters every part of the agent shares."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.received_events = r.counter(
            "evagg_received_events_total", "Events accepted, by route."
        )
        self.received_frames = r.counter(
            "evagg_received_frames_total", "Frames or requests accepted, by route."
        )
        self.received_bytes = r.counter(
            "evagg_received_bytes_total", "Payload bytes accepted, by route."
        )
        self.duplicate_frames = r.counter(
            "evagg_duplicate_frames_total", "Resent frames or events already spooled, by route."
        )
        self.rejected_events = r.counter(
            "evagg_rejected_events_total", "Events refused as bad input, by route."
        )
        self.bad_input = r.counter(
            "evagg_bad_input_total", "Bad frames, bodies or connections, by route and reason."
        )
        self.cut_values = r.counter(
            "evagg_cut_attribute_values_total",
            "Span attribute values cut to the documented length (the span kept), by route.",
        )
        self.connections = r.counter("evagg_connections_total", "Producer connections accepted.")
        self.unread_ack_pauses = r.counter(
            "evagg_unread_ack_pauses_total",
            "Times the agent stopped reading a producer that left its acks unread.")
        self.delivered_events = r.counter(
            "evagg_delivered_events_total", "Events durably delivered, by sink."
        )
        self.delivery_errors = r.counter(
            "evagg_delivery_errors_total", "Failed deliveries, by sink and kind."
        )
        self.retries = r.counter("evagg_retries_total", "Delivery retries, by sink.")
        self.dropped_events = r.counter(
            "evagg_dropped_events_total", "Events lost by policy, by reason."
        )
        self.producer_dropped_events = r.counter(
            "evagg_producer_dropped_events_total",
            "Events producers report lost in their own loss events, by reason.",
        )
        self.config_reloads = r.counter(
            "evagg_config_reloads_total",
            "Reloads of the sinks (SIGHUP), by result: applied, or refused (the log says why).",
        )
        self.reload_refused_at = r.gauge(
            "evagg_config_reload_refused_timestamp_seconds",
            "When the last reload was refused, while the sinks running are those before it "
            "(absent once a reload applies).",
        )
        self.worker_errors = r.counter(
            "evagg_worker_errors_total",
            "Exceptions caught in background workers, by worker and type.",
        )
        self.ray_careful_events = r.counter(
            "evagg_ray_careful_events_total",
            "Ray events mapped by the careful path, by reason (other_event_type, declined).",
        )
        self.ray_time_remaps = r.counter(
            "evagg_ray_time_remaps_total",
            "Ray bodies mapped again with times converted one by one.",
        )
        self.open_connections = r.gauge("evagg_open_connections", "Producer connections open now.")
        self.draining = r.gauge("evagg_draining", "1 while the agent drains before exit.")
        self.draining.set(0)  # a sample from the start: a healthy agent is not "No data"
        self.sink_permanent_error = r.gauge(
            "evagg_sink_permanent_error",
            "1 while a sink's last failure was permanent (credentials, missing bucket).",
        )
        # Present only while a sink's deliveries fail; `evagg status` turns them into words.
        self.sink_failing_since = r.gauge(
            "evagg_sink_failing_since_timestamp_seconds",
            "When a failing sink's run of failed attempts began, by sink and the kind of "
            "its last failure.",
        )
        # Present only while the spool's appends fail (a full disk); set at each render
        # from the spool's own fact (aggregator/gauges.py), declared here so that its
        # name is on /metrics before the first failure.
        self.spool_write_failing_since = r.gauge(
            "evagg_spool_write_failing_since_timestamp_seconds",
            "While the spool's appends fail (a full disk): since when, by the error's name "
            "(ENOSPC, EDQUOT, EROFS, EIO).",
        )
        self.sink_next_retry = r.gauge(
            "evagg_sink_next_retry_timestamp_seconds",
            "When a failing sink tries again, by sink.",
        )
