"""The agent's RED metrics, as the config asks for them (docs/metrics.md, "RED metrics
derived from events"): built and added to /metrics when `red_metrics` is on, else None."""

from __future__ import annotations

from aggregator.config import AgentConfig
from aggregator.metrics import AgentMetrics
from aggregator.red.metrics import RedMetrics


def build_red_metrics(config: AgentConfig, metrics: AgentMetrics) -> RedMetrics | None:
    if not config.red_metrics:
        return None
    red = RedMetrics(max_names=config.red_max_names)
    metrics.registry.add_renderer(red.render)
    return red
