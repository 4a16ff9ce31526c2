"""Producers' loss reports counted by their running totals: each drop once, whichever
reports the agent reads, misses or reads twice; and the agent's own losses that a stop
could not report, reported by the next start."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.losses import LossRecorder, ProducerLoss
from aggregator.metrics import Family


def counted(reports: list[ProducerLoss]) -> dict[str, float]:
    family = Family("evagg_producer_dropped_events_total", "", "counter")
    LossRecorder(producers=family).count_from_producers(reports)
    return {dict(key)["reason"]: value for key, value in family.values.items() if value}


def test_a_report_read_twice_counts_once() -> None:
    report = ProducerLoss("buffer_full", 40, "s1", 40)
    assert counted([report, report]) == {"buffer_full": 40}


def test_a_report_never_read_is_made_up_for_by_the_next() -> None:
    # the second report (40 more, total 80) sat behind frames the spool could not take
    assert counted([ProducerLoss("buffer_full", 40, "s1", 40),
                    ProducerLoss("buffer_full", 20, "s1", 100)]) == {"buffer_full": 100}


def test_a_session_first_seen_counts_its_events_not_its_total() -> None:
    # an agent restarted under a long-lived producer: its earlier drops went to the old one
    assert counted([ProducerLoss("nacked", 3, "s2", 50)]) == {"nacked": 3}


def test_sessions_and_reasons_apart_and_reports_without_totals_by_their_events() -> None:
    assert counted([ProducerLoss("buffer_full", 5, "a", 5), ProducerLoss("buffer_full", 7, "b", 7),
                    ProducerLoss("too_large", 1, "a", 1), ProducerLoss("other", 2, "", None),
                    ProducerLoss("other", 2, "", None)]) == {"buffer_full": 12, "too_large": 1,
                                                             "other": 4}


def test_losses_a_stop_could_not_report_are_reported_by_the_next_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stopping = LossRecorder()
    stopping.record("unstored_at_stop", 40)
    # in a frame the spool never held
    exited = ProducerLoss("exit_deadline", 2, "s9", 7, "train-7", "lr-sweep-3")
    stopping.record_unstored_reports(4242, [exited])
    stopping.keep_unreported(tmp_path)  # its final heartbeat found no room
    starting = LossRecorder()
    assert starting.recall_unreported(tmp_path) == 42
    assert starting.take_unreported() == {"unstored_at_stop": 40}  # the agent's own
    assert starting.take_unreported_reports() == [(4242, exited)]  # still the producer's
    assert starting.recall_unreported(tmp_path) == 0  # reported once, not at every start
    (tmp_path / "losses-unreported.json").write_text('{"unstored_at_stop": 5}')  # older agent
    older = LossRecorder()
    assert older.recall_unreported(tmp_path) == 5
    assert older.take_unreported() == {"unstored_at_stop": 5}
    (tmp_path / "losses-unreported.json").write_text("{not json")
    assert LossRecorder().recall_unreported(tmp_path) == 0
    assert "could not read the losses the last run left" in caplog.text
    assert not (tmp_path / "losses-unreported.json").exists()  # said once, not every start
