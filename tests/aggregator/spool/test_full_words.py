"""What the log says of drops for room: every dropped event is said, the minute's limit
holds back only when, not whether (a burst that ends within the minute was said only in
part: 1,411 of 17,825 events)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aggregator.spool import _full_words
from aggregator.spool._full_words import FullSpoolWords


def dropped_counts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().split("dropped the oldest ", 1)[1].split(" event")[0]
            for r in caplog.records if "dropped the oldest" in r.getMessage()]


def test_drops_held_back_by_the_minute_are_said_when_it_ends(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_full_words, "SAID_EVERY_S", 0.3)

    async def burst() -> None:
        words = FullSpoolWords()
        words.dropped(1411, ["collector"])  # said at once
        words.dropped(10_000, ["collector"])  # held back: within the minute
        words.dropped(6414, ["other"])
        await asyncio.sleep(0.6)  # the burst is over; nothing more is dropped

    with caplog.at_level(logging.WARNING, logger="evagg.spool"):
        asyncio.run(burst())
    assert dropped_counts(caplog) == ["1411", "16414"]
    assert "not yet delivered to collector, other" in caplog.records[-1].getMessage()


def test_drops_held_back_are_said_at_close(caplog: pytest.LogCaptureFixture) -> None:
    words = FullSpoolWords()
    with caplog.at_level(logging.WARNING, logger="evagg.spool"):
        words.dropped(5, ["collector"])
        words.dropped(7, ["collector"])
        words.say_dropped()  # what Spool.close() does
    assert dropped_counts(caplog) == ["5", "7"]
