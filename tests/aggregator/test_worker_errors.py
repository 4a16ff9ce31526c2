"""The background workers' one guard (aggregator/worker_errors.py): every failure counted
by worker and type, one log line a minute per place with its traceback, the rest counted."""

from __future__ import annotations

import logging

import pytest

from aggregator.metrics import AgentMetrics
from aggregator.worker_errors import WorkerErrors


def fail(errors: WorkerErrors, message: str, exc: Exception) -> None:
    try:
        raise exc
    except Exception as caught:
        errors.failed("heartbeat", caught, message, 2.0)


def test_a_failure_every_second_is_one_line_with_its_traceback_and_every_one_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = AgentMetrics()
    errors = WorkerErrors(metrics, logging.getLogger("evagg.test"))
    with caplog.at_level(logging.ERROR, logger="evagg.test"):
        for _ in range(100):
            fail(errors, "the heartbeat was not written; the next one is due in %gs",
                 OSError(28, "No space left on device"))
        fail(errors, "another place, its own line (%g)", OSError(5, "I/O error"))
        fail(errors, "the heartbeat was not written; the next one is due in %gs",
             ValueError("a bug"))
    assert metrics.worker_errors.get(worker="heartbeat", type="OSError") == 101
    assert metrics.worker_errors.get(worker="heartbeat", type="ValueError") == 1
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "the heartbeat was not written; the next one is due in 2s "
        "(OSError: [Errno 28] No space left on device)",
        "another place, its own line (2) (OSError: [Errno 5] I/O error)",
        "the heartbeat was not written; the next one is due in 2s (ValueError: a bug)"]
    assert all(record.exc_info for record in caplog.records)  # the traceback goes with it
