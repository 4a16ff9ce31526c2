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


def test_what_was_held_back_is_said_once_its_interval_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    """A burst of refusals that ended within the minute was said as its first line only:
    1 of 20 dead-lettered batches in a trial's log."""
    import time

    limited = RateLimitedLog(logging.getLogger("evagg.test.held"), interval_s=0.05)
    with caplog.at_level(logging.WARNING, logger="evagg.test.held"):
        for n in range(5):
            limited.log(logging.WARNING, "refused", "refused batch %d", n)
        limited.say_held()  # the interval is not over: nothing yet
        time.sleep(0.06)
        limited.say_held()
        limited.say_held()  # said once
    assert [r.getMessage() for r in caplog.records] == [
        "refused batch 0", "refused batch 4 (4 like it since the last report)"]


def test_at_close_everything_held_is_said(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger("evagg.test.close"), interval_s=60)
    with caplog.at_level(logging.WARNING, logger="evagg.test.close"):
        limited.log(logging.WARNING, "k", "first")
        limited.log(logging.WARNING, "k", "second")
        limited.say_held(force=True)
    assert [r.getMessage() for r in caplog.records] == [
        "first", "second (1 like it since the last report)"]
