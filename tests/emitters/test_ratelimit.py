"""The shared once-an-interval log: one line per kind of problem, then how many it held."""

from __future__ import annotations

import logging

import pytest

from emitters.ratelimit import RateLimitedLog


def test_a_flood_is_one_line_and_the_next_report_counts_what_it_held(
        caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("evagg.test.ratelimit")
    limited = RateLimitedLog(logger, interval_s=3600.0)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for attempt in range(50):
            limited.log(logging.WARNING, "disk", "spool full (attempt %d)", attempt)
        limited.log(logging.WARNING, "other", "a different problem")
    assert [r.getMessage() for r in caplog.records] == [
        "spool full (attempt 0)", "a different problem"]

    caplog.clear()
    limited._last["disk"] -= 7200.0  # the interval has passed
    with caplog.at_level(logging.WARNING, logger=logger.name):
        limited.log(logging.WARNING, "disk", "spool full (attempt %d)", 50)
    assert [r.getMessage() for r in caplog.records] == [
        "spool full (attempt 50) (49 more since the last report)"]
