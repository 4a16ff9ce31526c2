"""dashboard/raystate keeps its own copy of Ray's State API columns and filter rules (the
dashboard must not need Ray): both are checked here against the installed Ray's."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import MultiDict

from dashboard.raystate.options import RayApiError, filters_of, matches
from dashboard.raystate.schema import SCHEMAS, columns, filterable

common = pytest.importorskip("ray.util.state.common")
RAY_SCHEMAS = {"tasks": common.TaskState, "actors": common.ActorState,
               "nodes": common.NodeState, "workers": common.WorkerState,
               "jobs": common.JobState, "placement_groups": common.PlacementGroupState}


@pytest.mark.parametrize("resource", sorted(SCHEMAS))
def test_columns_and_filterable_columns_are_ray_s(resource: str) -> None:
    ray = RAY_SCHEMAS[resource]
    assert columns(resource, detail=False) == ray.list_columns(detail=False)
    assert columns(resource, detail=True) == ray.list_columns(detail=True)
    assert set(filterable(resource)) == ray.filterable_columns()


ROWS: list[dict[str, Any]] = [
    {"task_id": "a1", "name": "Square", "state": "FINISHED", "worker_pid": 7, "error_type": None,
     "is_debugger_paused": None},
    {"task_id": "b2", "name": "boom", "state": "FAILED", "worker_pid": 8,
     "error_type": "TASK_EXECUTION_EXCEPTION", "is_debugger_paused": False},
]
FILTERS = [
    [("name", "=", "square")], [("name", "!=", "SQUARE")], [("error_type", "!=", "x")],
    [("error_type", "=", "task_execution_exception")], [("worker_pid", "=", "8")],
    [("worker_pid", "!=", "8"), ("state", "=", "finished")], [("NAME", "=", "boom")],
    [("is_debugger_paused", "=", "false")],
]


@pytest.mark.parametrize("given", FILTERS, ids=str)
def test_filters_keep_the_rows_ray_s_do_filter_keeps(given: list[tuple[str, str, str]]) -> None:
    from ray.dashboard.state_api_utils import do_filter

    query = MultiDict([(k, v) for key, predicate, value in given
                       for k, v in (("filter_keys", key), ("filter_predicates", predicate),
                                    ("filter_values", value))])
    ours = [r["task_id"] for r in ROWS if matches(r, filters_of(query, "tasks"))]
    theirs = [r["task_id"] for r in do_filter([dict(r) for r in ROWS], given,
                                              common.TaskState, False)]
    assert ours == theirs


@pytest.mark.parametrize(("query", "wording"), [
    ([("filter_keys", "events"), ("filter_predicates", "="), ("filter_values", "1")],
     "The given filter column events is not supported"),
    ([("filter_keys", "name"), ("filter_predicates", ">"), ("filter_values", "1")],
     "Unsupported filter predicate > is given. Available predicates: =, !=."),
    ([("filter_keys", "worker_pid"), ("filter_predicates", "="), ("filter_values", "x")],
     "Invalid filter `--filter worker_pid x` for a int type column"),
])
def test_bad_filters_get_ray_s_wording(query: list[tuple[str, str]], wording: str) -> None:
    with pytest.raises(RayApiError, match=None) as refused:
        filters_of(MultiDict(query), "tasks")
    assert wording in refused.value.message


@pytest.mark.parametrize(("query", "wording"), [
    ([("limit", "100001")], "exceeds the supported limit 100000"),
    ([("limit", "ten")], "limit must be an integer"),
    ([("timeout", "0")], "timeout must be at least 1 second"),
    ([("detail", "yes")], "Failed to convert a value yes"),
    ([("filter_keys", "name")], "the same number of times"),
])
def test_bad_options_are_refused_before_any_query(query: list[tuple[str, str]],
                                                  wording: str) -> None:
    from dashboard.raystate.options import list_options

    with pytest.raises(RayApiError) as refused:
        list_options(MultiDict(query), "tasks")
    assert wording in refused.value.message


def test_the_answer_is_due_before_the_client_gives_up() -> None:
    from dashboard.raystate.options import list_options

    assert list_options(MultiDict([("timeout", "30")]), "tasks").timeout_s == 24  # as Ray's
    assert list_options(MultiDict([("timeout", "1")]), "tasks").timeout_s == 1
