"""A caller's field values into event columns (emitters/values.py), the cases an audit
found wrong: datetimes converted exactly, and out of the nanosecond column's range kept
as text in attrs instead of lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from emitters.values import apply_fields


def columns(**fields: Any) -> tuple[dict[str, Any], dict[str, str]]:
    event: dict[str, Any] = {}
    attrs: dict[str, str] = {}
    apply_fields(event, attrs, fields)
    return event, attrs


def test_an_aware_datetime_is_exact_nanoseconds_in_any_zone() -> None:
    when = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert columns(time=when)[0] == {"time": 1_767_261_600_123_456_000}


def test_a_datetime_outside_the_column_goes_to_attrs_as_text() -> None:
    for when in (datetime(9999, 1, 1, tzinfo=UTC), datetime(2300, 1, 1, tzinfo=UTC),
                 datetime(1969, 12, 31, 23, 59, 58, 500000, tzinfo=UTC)):
        event, attrs = columns(time=when)
        assert "time" not in event and attrs == {"time": when.isoformat()}
