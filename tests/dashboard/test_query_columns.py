"""`evagg query tasks --wide`, `--json`, `--csv` and `--columns`: every column of the
tasks view, read off the view, so a column added to it needs no edit here."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tests.commands import evagg

# Columns the issue found missing (docs/queries.md lists the view's columns).
ONCE_MISSING = ("parent_id", "actor_id", "trace_id", "exception_class", "stack_trace",
                "task_type", "function", "ray_session", "first_seen", "last_seen", "events")


def view_columns(lake: Path) -> list[str]:
    """The tasks view's columns, as `evagg query sql` shows them."""
    described = evagg("query", "--data", str(lake), "sql", "SELECT * FROM tasks LIMIT 1",
                      "--csv")
    assert described.returncode == 0, described.stderr
    return next(csv.reader(io.StringIO(described.stdout)))


def test_json_csv_and_wide_have_every_column_of_the_view(lake: Path) -> None:
    columns = view_columns(lake)
    assert set(ONCE_MISSING) <= set(columns)
    as_json = evagg("query", "--data", str(lake), "tasks", "--json", "--limit", "3")
    assert as_json.returncode == 0, as_json.stderr
    assert [list(row) for row in json.loads(as_json.stdout)] == [columns] * 3
    as_csv = evagg("query", "--data", str(lake), "tasks", "--csv", "--limit", "1")
    assert next(csv.reader(io.StringIO(as_csv.stdout))) == columns
    wide = evagg("query", "--data", str(lake), "tasks", "--wide", "--limit", "1")
    assert wide.returncode == 0, wide.stderr
    assert wide.stdout.splitlines()[0].split() == columns
    short = evagg("query", "--data", str(lake), "tasks", "--limit", "1")
    assert short.stdout.splitlines()[0].split() == ["task_id", "attempt", "name",
                                                    "final_state", "node_id", "duration_s",
                                                    "error_type"]


def test_columns_takes_any_column_of_the_view_and_names_the_choices(lake: Path) -> None:
    chosen = evagg("query", "--data", str(lake), "tasks", "--columns",
                   "task_id,actor_id,first_seen,events", "--json", "--limit", "1")
    assert chosen.returncode == 0, chosen.stderr
    assert list(json.loads(chosen.stdout)[0]) == ["task_id", "actor_id", "first_seen", "events"]
    wrong = evagg("query", "--data", str(lake), "tasks", "--columns", "task_id,nosuch")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.startswith("evagg query: --columns: nosuch: not a column of the "
                                   "tasks view; choose from task_id, ")
    assert all(column in wrong.stderr for column in ONCE_MISSING)
    empty = evagg("query", "--data", str(lake), "tasks", "--columns", ",")
    assert empty.returncode == 2 and "--columns: none given" in empty.stderr


def test_output_flags_and_refresh_zero_are_explained_in_help() -> None:
    for command in (("query", "--help"), ("query", "tasks", "--help")):
        shown = " ".join(evagg(*command).stdout.split())
        assert "--json print an array of JSON objects, every column" in shown, command
        assert "--csv print CSV with a header row, every column" in shown, command
    dashboard = " ".join(evagg("dashboard", "--help").stdout.split())
    assert "0 lists the store again for every request" in dashboard
