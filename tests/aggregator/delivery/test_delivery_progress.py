"""A sink's running attempt and its delivered rate over the last minute, as the delivery
loop keeps them for /metrics and `evagg status`; clocks of the test's own."""

from __future__ import annotations

from aggregator.cli.status_health import LONG_ATTEMPT_S, sink_health
from aggregator.delivery.progress import RATE_WINDOW_S, DeliveryProgress


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_rate_is_the_last_minutes_whatever_the_bursts() -> None:
    clock = Clock(500.0)
    progress = DeliveryProgress(clock=clock)
    clock.now += RATE_WINDOW_S
    for _ in range(6):  # a file of 1,000 events every 10 s, nothing between
        clock.now += 10.0
        progress.delivered(1000)
    assert progress.events_per_second() == 100.0
    clock.now += RATE_WINDOW_S
    assert progress.events_per_second() == 0.0


def test_a_young_sinks_rate_is_over_its_life_not_the_whole_minute() -> None:
    clock = Clock(500.0)
    progress = DeliveryProgress(clock=clock)
    clock.now += 5.0
    progress.delivered(50)
    assert progress.events_per_second() == 10.0


def test_the_attempt_start_is_exported_while_it_runs_only() -> None:
    progress = DeliveryProgress(wall_clock=lambda: 1_800_000_000.0)
    assert progress.attempt_started_at == 0.0
    progress.attempt_started()
    assert progress.attempt_started_at == 1_800_000_000.0
    progress.attempt_ended()
    assert progress.attempt_started_at == 0.0


def test_status_says_a_long_attempt_and_not_a_short_one() -> None:
    started = 1_800_000_000.0
    sample = {'evagg_sink_lag_events{sink="lake"}': 10.0,
              'evagg_sink_attempt_started_timestamp_seconds{sink="lake"}': started}
    assert sink_health(sample, started + LONG_ATTEMPT_S - 1) == {"lake": "ok"}
    assert sink_health(sample, started + 35) == {
        "lake": "ok, delivering since 08:00:00 UTC (35 s)"}
