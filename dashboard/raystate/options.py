"""Ray's State API query parameters and response envelope, read and written as Ray does.

The parameters are those `ray.util.state.StateApiClient` sends (and the dashboard's
`state_api_utils.options_from_req` reads): `limit`, `timeout`, `detail`,
`exclude_driver`, and filters as three repeated lists `filter_keys`,
`filter_predicates`, `filter_values`. Answers are Ray's envelope
`{"result": true, "msg": "", "data": {"result": <ListApiResponse>}}`; a refusal is
`{"result": false, "msg": <why>, "data": {"result": null}}` with a 4xx/5xx status, which
Ray's client shows as "API server internal error ... Error: <why>".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from dashboard.raystate.schema import Column, filterable

DEFAULT_LIMIT = 100  # Ray's DEFAULT_LIMIT
# Ray's server refuses a limit over 10,000 (RAY_MAX_LIMIT_FROM_API_SERVER); the store
# holds every task, so evagg answers up to this many.
MAX_LIMIT = 100_000
DEFAULT_TIMEOUT_S = 30  # Ray's DEFAULT_RPC_TIMEOUT
# Ray's server answers within 80% of the client's timeout, so that the client hears
# "too slow" instead of timing out itself (ListApiOptions.server_timeout_multiplier).
SERVER_SHARE = 0.8


class RayApiError(Exception):
    """A request Ray's server would refuse too; the message is Ray's wording."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Filter:
    column: Column
    predicate: str  # "=" or "!="
    value: Any  # converted to the column's kind


@dataclass(frozen=True, slots=True)
class ListOptions:
    limit: int = DEFAULT_LIMIT
    timeout_s: int = DEFAULT_TIMEOUT_S
    detail: bool = False
    exclude_driver: bool = True
    filters: tuple[Filter, ...] = field(default_factory=tuple)


def reply(result: Any) -> web.Response:
    return web.json_response({"result": True, "msg": "", "data": {"result": result}})


def refusal(message: str, status: int) -> web.Response:
    return web.json_response({"result": False, "msg": message, "data": {"result": None}},
                             status=status)


def to_bool(value: str, what: str) -> bool:
    """Ray's convert_string_to_type(value, bool): only these six spellings."""
    if value in ("True", "true", "1"):
        return True
    if value in ("False", "false", "0"):
        return False
    raise RayApiError(f"Failed to convert a value {value} of type {type(value)} to "
                      f"{bool} ({what})")


def _int(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise RayApiError(f"{what} must be an integer, not {value!r}") from None


def list_options(query: MultiMapping[str], resource: str) -> ListOptions:
    limit = _int(query.get("limit", str(DEFAULT_LIMIT)), "limit")
    if limit > MAX_LIMIT:
        raise RayApiError(f"Given limit {limit} exceeds the supported limit {MAX_LIMIT}. "
                          "Use a lower limit, or filters to narrow the list.")
    if limit < 0:
        raise RayApiError(f"limit must not be negative, not {limit}")
    timeout = _server_timeout(query)
    return ListOptions(
        limit=limit,
        timeout_s=timeout,
        detail=to_bool(query.get("detail", "false"), "detail"),
        exclude_driver=to_bool(query.get("exclude_driver", "true"), "exclude_driver"),
        filters=filters_of(query, resource),
    )


def summary_options(query: MultiMapping[str], resource: str) -> ListOptions:
    """Ray's summaries read every row (its own read 10,000 at most) with the filters."""
    if query.get("summary_by", "func_name") not in ("func_name", "task_name"):
        raise RayApiError("summary_by must be func_name or task_name here: evagg does not "
                          "serve the lineage summary (summary_by=lineage)")
    return ListOptions(limit=MAX_LIMIT, timeout_s=_server_timeout(query),
                       filters=filters_of(query, resource))


def _server_timeout(query: MultiMapping[str]) -> int:
    timeout = _int(query.get("timeout", str(DEFAULT_TIMEOUT_S)), "timeout")
    if timeout < 1:
        raise RayApiError("timeout must be at least 1 second")
    return max(1, int(timeout * SERVER_SHARE))


def filters_of(query: MultiMapping[str], resource: str) -> tuple[Filter, ...]:
    keys = query.getall("filter_keys", [])
    predicates = query.getall("filter_predicates", [])
    values = query.getall("filter_values", [])
    if not len(keys) == len(predicates) == len(values):
        raise RayApiError("filter_keys, filter_predicates and filter_values must be given "
                          "the same number of times")
    allowed = filterable(resource)
    found = []
    for key, predicate, value in zip(keys, predicates, values, strict=True):
        if predicate not in ("=", "!="):
            raise RayApiError(f"Unsupported filter predicate {predicate} is given. "
                              "Available predicates: =, !=.")
        column = allowed.get(key.lower())
        if column is None:
            raise RayApiError(
                f"The given filter column {key.lower()} is not supported. Enter filters "
                "with --filter key=value or --filter key!=value Supported filter columns: "
                f"{set(allowed)}")
        found.append(Filter(column, predicate, _filter_value(column, value)))
    return tuple(found)


def _filter_value(column: Column, value: str) -> Any:
    """Ray's convert_filters_type: the value read as the column's type."""
    if column.kind == "int":
        try:
            return int(value)
        except ValueError:
            raise RayApiError(f"Invalid filter `--filter {column.name} {value}` for a int type "
                              f"column. Please provide an integer filter "
                              f"`--filter {column.name} [int]`") from None
    if column.kind == "bool":
        try:
            return to_bool(value, column.name)
        except RayApiError:
            raise RayApiError(
                f"Invalid filter `--filter {column.name} {value}` for a boolean type column. "
                f"Please provide `--filter {column.name} [True|true|1]` for True or "
                f"`--filter {column.name} [False|false|0]` for False.") from None
    return value


def matches(row: dict[str, Any], filters: tuple[Filter, ...]) -> bool:
    """Ray's do_filter for one row: strings compare without case; a missing value is
    never equal and always unequal."""
    for f in filters:
        have = row.get(f.column.name)
        if isinstance(have, str) and isinstance(f.value, str):
            equal = have.lower() == f.value.lower()
        else:
            equal = have == f.value
        if equal != (f.predicate == "="):
            return False
    return True


def list_response(rows: list[dict[str, Any]], *, total: int, filtered: int,
                  warnings: list[str] | None = None) -> dict[str, Any]:
    """Ray's ListApiResponse. Nothing is truncated at a data source here, so
    num_after_truncation is the total; Ray's client warns when num_filtered > len(result)."""
    return {"total": total, "num_after_truncation": total, "num_filtered": filtered,
            "result": rows, "partial_failure_warning": "", "warnings": warnings or None}
