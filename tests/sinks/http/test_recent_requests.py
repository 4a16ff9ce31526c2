"""The HTTP sink's window of recent requests: what `evagg status` and the log count, and
when the log speaks. A clock of the test's own stands for five minutes passing."""

from __future__ import annotations

from sinks.http.recent import SAY_EVERY_S, WINDOW_S, RecentRequests


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_counts_failed_requests_by_kind_and_forgets_after_five_minutes() -> None:
    clock = Clock()
    recent = RecentRequests(clock=clock)
    for kind in ("http_5xx", "connect", None) * 4:
        recent.ended(kind)
        clock.now += 1.0
    gauges = recent.gauges()
    assert gauges["recent_requests"] == 12 and gauges["recent_requests_failed"] == 8
    assert gauges["recent_failures_http_5xx"] == 4 and gauges["recent_failures_connect"] == 4
    assert gauges["recent_failures_timeout"] == gauges["recent_failures_throttled"] == 0
    assert recent.window().kinds_text() in ("http_5xx 4, connect 4", "connect 4, http_5xx 4")
    clock.now += WINDOW_S
    assert recent.gauges()["recent_requests"] == 0  # all of it older than the window


def test_the_log_speaks_once_failures_are_many_and_not_again_for_ten_minutes() -> None:
    clock = Clock()
    recent = RecentRequests(clock=clock)
    for _ in range(9):  # nine failures among answers: not yet worth a line
        recent.ended("http_5xx")
        recent.ended(None)
    assert recent.worth_saying() is None
    recent.ended("http_5xx")
    said = recent.worth_saying()
    assert said is not None and said.failed_total == 10 and said.requests == 19
    assert recent.worth_saying() is None  # said: not again at once
    clock.now += SAY_EVERY_S
    for _ in range(10):
        recent.ended("timeout")
        recent.ended(None)
    assert recent.worth_saying() is not None


def test_an_endpoint_that_answers_nothing_is_left_to_the_delivery_loop() -> None:
    recent = RecentRequests(clock=Clock())
    for _ in range(20):
        recent.ended("connect")
    assert recent.worth_saying() is None


def test_few_failures_among_many_answers_are_no_news() -> None:
    recent = RecentRequests(clock=Clock())
    for _ in range(12):
        recent.ended("timeout")
    for _ in range(100):
        recent.ended(None)
    assert recent.worth_saying() is None
    assert recent.gauges()["recent_requests_failed"] == 12  # counted all the same
