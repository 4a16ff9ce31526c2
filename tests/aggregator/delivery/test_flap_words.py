"""FlapWords over a scripted clock: what the log says of a sink's failures and recoveries
(the agent's own log under a flapping endpoint is test_flapping_log.py)."""

from __future__ import annotations

from aggregator.delivery.flaps import FLAP_WINDOW_S, LONG_RUN, FlapWords


def flap(words: FlapWords, now: float) -> tuple[str | None, bool]:
    """One run of one failed attempt at `now`, recovered a moment later."""
    said = words.say_failure(now, first_of_kind=True, attempts=1)
    return said, words.say_recovery(now + 0.1)


def test_flaps_after_the_first_are_held_then_counted_in_the_next_line() -> None:
    words = FlapWords()
    assert flap(words, 0.0) == ("", True)  # an outage's first line and its recovery
    assert [flap(words, t) for t in (5.0, 10.0, 15.0)] == [(None, False)] * 3
    said, recovered = flap(words, FLAP_WINDOW_S + 1)
    assert said is not None and "3 more short runs of failures" in said and recovered
    assert flap(words, FLAP_WINDOW_S + 5) == (None, False)  # held again, for a minute


def test_a_run_that_goes_on_is_said_whatever_came_before() -> None:
    words = FlapWords()
    flap(words, 0.0)
    assert words.say_failure(5.0, first_of_kind=True, attempts=1) is None
    for attempt in range(2, LONG_RUN):
        assert words.say_failure(5.0 + attempt, first_of_kind=False, attempts=attempt) is None
    flap(words, 20.0)
    assert words.say_failure(30.0, first_of_kind=True, attempts=1) is None
    for attempt in range(2, LONG_RUN):
        assert words.say_failure(30.0 + attempt, first_of_kind=False, attempts=attempt) is None
    said = words.say_failure(39.0, first_of_kind=False, attempts=LONG_RUN)
    assert said is not None and "2 more short runs of failures" in said, said
    assert words.say_failure(10.0, first_of_kind=False, attempts=LONG_RUN + 1) is None
    assert words.say_recovery(11.0)  # its end is said too


def test_a_sink_that_recovered_long_ago_is_said_at_once() -> None:
    words = FlapWords()
    flap(words, 0.0)
    assert flap(words, FLAP_WINDOW_S + 1) == ("", True)


def test_a_permanent_failure_soon_after_a_flap_is_said_at_once() -> None:
    words = FlapWords()
    flap(words, 0.0)
    said = words.say_failure(5.0, first_of_kind=True, attempts=1, permanent=True)
    assert said == ""  # said, though a transient failure here would be held as a flap
    assert words.say_failure(65.0, first_of_kind=False, attempts=2, permanent=True) is None
