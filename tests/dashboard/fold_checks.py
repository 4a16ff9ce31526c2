"""What the fold's tests check: a Store that folds into a cache answers as one that runs
tasks.sql over every event (fold=False), row for row and figure for figure."""

from __future__ import annotations

import math
from typing import Any

from dashboard.lake.store import Store
from dashboard.lake.views import NANOS_TYPES
from dashboard.questions import queries
from dashboard.questions.overview import overview

TASKS_SQL = "SELECT * FROM tasks ORDER BY task_id, attempt, ray_session"


def assert_same_figures(mine: list[list[Any]], reference: list[list[Any]]) -> None:
    """The fold's summary against quantile_cont's: on DuckDB 1.x the same arithmetic, equal
    to the last bit; DuckDB 2 interpolates with a fused multiply-add, which SQL cannot
    write, so there the quantiles may differ in the last bit or two."""
    if not NANOS_TYPES:
        assert mine == reference
        return
    assert len(mine) == len(reference)
    for got, want in zip(mine, reference, strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            if isinstance(a, float) and isinstance(b, float):
                assert math.isclose(a, b, rel_tol=1e-13), (got, want)
            else:
                assert a == b, (got, want)


def assert_same(cached: Store, scratch: Store) -> None:
    """The folded store's tasks, summary and overview equal the one folding from scratch."""
    cached.refresh(force=True)
    scratch.refresh(force=True)
    mine, reference = cached.execute(TASKS_SQL), scratch.execute(TASKS_SQL)
    assert mine.columns == reference.columns
    assert mine.rows == reference.rows
    summary, expected = queries.summary(cached), queries.summary(scratch)
    assert summary.columns == expected.columns
    assert_same_figures(summary.rows, expected.rows)
    assert overview(cached) == overview(scratch)
