"""The overview's events over time when one producer's clock is wrong: an event stamped
in the year 2100 had stretched every bucket to 30 days and put the cluster's whole day in
one bar. It is counted apart, not charted, folded or not."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from dashboard.questions.overview import overview
from tests.dashboard.lakegen import at, event, local_put, write_rows

YEAR_2100_NS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1e9)


def overview_of(tmp_path: Path, rows: list[dict[str, Any]], folded: bool) -> dict[str, Any]:
    """The overview of a lake of `rows`, through the fold's cache or from scratch."""
    write_rows(local_put(tmp_path / "lake"), rows, "part-1.parquet")
    cache = str(tmp_path / "cache") if folded else None
    store = Store(StoreOptions(str(tmp_path / "lake"), cache_dir=cache, fold=folded))
    try:
        return overview(store)
    finally:
        store.close()


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "from-scratch"])
def test_an_event_from_a_wrong_clock_is_counted_apart_not_charted(
        tmp_path: Path, folded: bool) -> None:
    rows = [event(kind="task", source="script", task_id=f"t{n}", name="work",
                  state="FINISHED", time=at(60.0 * n)) for n in range(30)]
    rows.append(event(kind="task", source="script", task_id="late", name="work",
                      state="FINISHED", time=YEAR_2100_NS))
    found = overview_of(tmp_path, rows, folded)
    assert found["ahead_of_now"] == 1
    assert found["events"] == 31  # still counted
    assert found["bucket_s"] <= 60  # the half hour of real work, not 30-day buckets
    assert sum(point["events"] for point in found["timeline"]) == 30
    assert all(point["t"] < "2099" for point in found["timeline"])


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "from-scratch"])
def test_a_lake_whose_every_event_is_ahead_of_now_charts_nothing(
        tmp_path: Path, folded: bool) -> None:
    rows = [event(kind="task", source="script", task_id=f"t{n}", name="work",
                  state="FINISHED", time=YEAR_2100_NS + n * 10**9) for n in range(3)]
    found = overview_of(tmp_path, rows, folded)
    assert found["ahead_of_now"] == 3 and found["events"] == 3
    assert found["timeline"] == [] and found["bucket_s"] == 60


def test_the_sql_width_rule_agrees_with_bucket_width_s_at_every_boundary() -> None:
    """The overview's one-statement count picks its width in SQL (WIDTH_SQL); the span
    alone picks it in Python (bucket_width_s): the same rule, written twice."""
    import duckdb

    from dashboard.questions.overview import MAX_BUCKETS, WIDTH_SQL, WIDTHS_S, bucket_width_s

    spans = [0.0, 0.5] + [w * MAX_BUCKETS + d for w in WIDTHS_S for d in (-1e-6, 0.0, 1e-6)]
    con = duckdb.connect()
    for span_s in spans:
        in_sql = con.execute(f"SELECT {WIDTH_SQL} FROM (SELECT $s::DOUBLE AS span_s)",
                             {"s": span_s}).fetchone()
        assert in_sql is not None
        assert in_sql[0] == bucket_width_s(0, round(span_s * 1e6)), span_s
