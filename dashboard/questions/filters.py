"""User filters, checked and turned into SQL with DuckDB parameters (never pasted text).

Only fixed SQL fragments written here reach the query string; every value the user gave
travels as a named parameter ($name). Sorting goes through an allow-list of columns.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dashboard.lake.errors import BadInput

MAX_TEXT = 500
_STATE = re.compile(r"^[A-Z_]{1,32}$")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# filter name -> column of the tasks view it compares with (exact match)
TASK_EQUALS = {
    "state": "final_state",
    "name": "name",
    "job": "job_id",
    "node": "node_id",
    "error_type": "error_type",
    "worker": "worker_id",
    # Ray numbers jobs from 01000000 again in every cluster: a lake of many clusters
    # tells their tasks apart by session (`evagg query jobs` lists them)
    "session": "ray_session",
}
# The value of an exact filter that asks for tasks without that field: the groups'
# "(no error type)" and "(no job id)" rows link to their tasks with it.
NO_VALUE = "(none)"
# when a task happened, for --since/--until: its first known state time
TASK_TIME = "coalesce(pending_at, submitted_at, running_at, finished_at, failed_at)"
SEARCHED_TASK_COLUMNS = ("task_id", "name", "job_id", "node_id", "worker_id", "error_type",
                         "error_message", "stack_trace")
# sort key -> column of the tasks view; anything else is refused
TASK_SORTS = {
    "time": "task_time", "task_id": "task_id", "attempt": "attempt", "name": "name",
    "state": "final_state", "duration": "duration_s", "job": "job_id", "node": "node_id",
    "worker": "worker_id", "pid": "pid", "error_type": "error_type",
    "pending_at": "pending_at", "running_at": "running_at", "finished_at": "finished_at",
    "failed_at": "failed_at",
}


def parse_time(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """ISO 8601 (a date, or a time with or without zone: UTC assumed), "now", or an age
    such as "90s", "15m", "2h", "3d", "1w" meaning that long before now."""
    value = text.strip()
    now = now or dt.datetime.now(dt.UTC)
    if value.lower() == "now":
        return now
    relative = _RELATIVE.match(value.lower())
    if relative:
        return now - dt.timedelta(seconds=float(relative.group(1)) * _UNIT_S[relative.group(2)])
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadInput(f"cannot read time {text!r}: use ISO 8601 (2025-03-01T12:00:00Z) "
                       "or an age such as 15m, 2h, 3d") from None
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)


def clean_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{name} must be text")
    if len(value) > MAX_TEXT:
        raise BadInput(f"{name} is longer than {MAX_TEXT} characters")
    if "\x00" in value:
        raise BadInput(f"{name} contains a NUL character")
    return value


@dataclass(frozen=True, slots=True)
class TaskFilter:
    state: str | None = None
    name: str | None = None
    job: str | None = None
    node: str | None = None
    error_type: str | None = None
    worker: str | None = None
    session: str | None = None  # a Ray session's name
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    text: str | None = None  # searched in ids, names, error messages and stack traces

    @staticmethod
    def from_mapping(values: Mapping[str, Any], *, now: dt.datetime | None = None) -> TaskFilter:
        known = {f.name for f in fields(TaskFilter)}
        unknown = sorted(k for k in values if k not in known)
        if unknown:
            raise BadInput(f"unknown filter {unknown[0]!r} (known: {', '.join(sorted(known))})")
        given = {k: clean_text(k, v) for k, v in values.items() if v not in (None, "")}
        if "state" in given:
            given["state"] = given["state"].strip().upper()
            if not _STATE.match(given["state"]):
                raise BadInput(f"malformed state {values['state']!r}")
        since = parse_time(given.pop("since"), now=now) if "since" in given else None
        until = parse_time(given.pop("until"), now=now) if "until" in given else None
        if since is not None and until is not None and since > until:
            raise BadInput("since is later than until")
        return TaskFilter(
            state=given.get("state"), name=given.get("name"), job=given.get("job"),
            node=given.get("node"), error_type=given.get("error_type"),
            worker=given.get("worker"), session=given.get("session"), text=given.get("text"),
            since=since, until=until)

    def where(self, columns: list[str]) -> tuple[str, dict[str, Any]]:
        """A WHERE clause (or "") over the tasks view, and its parameters."""
        parts: list[str] = []
        params: dict[str, Any] = {}
        for key, column in TASK_EQUALS.items():
            value = getattr(self, key)
            if value is None:
                continue
            if column not in columns:
                raise BadInput(f"the tasks view has no column {column!r} to filter {key} on")
            if value == NO_VALUE and key != "state":  # every task has a state
                parts.append(_missing(key, column, columns))
                continue
            parts.append(_equals(key, column, columns))
            params[key] = value
        if self.since is not None:
            parts.append(f"{TASK_TIME} >= CAST($since AS TIMESTAMPTZ)")
            params["since"] = self.since.isoformat()
        if self.until is not None:
            parts.append(f"{TASK_TIME} < CAST($until AS TIMESTAMPTZ)")
            params["until"] = self.until.isoformat()
        if self.text:
            searched = [c for c in SEARCHED_TASK_COLUMNS if c in columns]
            parts.append("(" + " OR ".join(f"contains(lower({c}), $text)" for c in searched) + ")")
            params["text"] = self.text.lower()
        return (" WHERE " + " AND ".join(parts)) if parts else "", params


def _missing(key: str, column: str, columns: list[str]) -> str:
    """The tasks without the field: a failure without an error type has neither Ray's
    exception class nor an error type (its group in the summaries)."""
    if key == "error_type" and "exception_class" in columns:
        return f"({column} IS NULL AND exception_class IS NULL)"
    return f"{column} IS NULL"


def _equals(key: str, column: str, columns: list[str]) -> str:
    # A Ray failure is grouped by its exception class (summaries.sql), so its group's
    # link asks for the class; Ray's own error type (TASK_EXECUTION_EXCEPTION) still finds it.
    if key == "error_type" and "exception_class" in columns:
        return f"({column} = ${key} OR exception_class = ${key})"
    # A job's group is its job_key (dashboard/sql/keys.sql: a Ray job at its session),
    # so its link asks for that; a bare job id still finds the job in every cluster.
    if key == "job" and "ray_session" in columns:
        return f"({column} = ${key} OR job_key({column}, ray_session) = ${key})"
    # a session's name or its start (session_2026-12-06: that day's clusters), as the
    # other session options take one
    if key == "session":
        return f"starts_with({column}, ${key})"
    return f"{column} = ${key}"


def task_order(sort: str | None, order: str | None, columns: list[str]) -> str:
    """ORDER BY text from the allow-list; the unique key breaks ties so pages are stable."""
    key = (sort or "time").strip()
    if key not in TASK_SORTS:
        raise BadInput(f"cannot sort by {key!r} (choose from {', '.join(sorted(TASK_SORTS))})")
    column = TASK_SORTS[key]
    if column != "task_time" and column not in columns:
        raise BadInput(f"the tasks view has no column {column!r} to sort by")
    direction = (order or "desc").strip().lower()
    if direction not in ("asc", "desc"):
        raise BadInput(f"order must be asc or desc, not {order!r}")
    return f" ORDER BY {column} {direction.upper()} NULLS LAST, task_id, attempt"


def bounded_int(name: str, value: Any, default: int, low: int, high: int) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise BadInput(f"{name} must be a whole number, not {value!r}") from None
    if not low <= number <= high:
        raise BadInput(f"{name} must be between {low} and {high}")
    return number
