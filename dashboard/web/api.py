"""JSON endpoints under /api/ that the dashboard's pages call.

Every handler reads its query string through the same checks as the CLI (filters.py):
values become DuckDB parameters, sort keys and dimensions come from allow-lists, and
anything else is a 400 with a message. Results are cached per store version (the file
list's fingerprint), so a page that polls while nothing new was written costs nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from dashboard.lake.errors import BadInput, NoData
from dashboard.lake.results import Result
from dashboard.lake.store import Store
from dashboard.questions import ledger, queries
from dashboard.questions.filters import TaskFilter, bounded_int
from dashboard.questions.overview import op_counts, overview
from dashboard.questions.runner import QueryRunner
from sinks.units import parse_duration

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# the task filters (TaskFilter's fields; its `text` is `q` here) and the paging
TASK_PARAMS = ({f.name for f in fields(TaskFilter)} - {"text"}) | {"q", "sort", "order", "limit",
                                                                  "offset"}


def json_result(result: Result) -> dict[str, Any]:
    payload: dict[str, Any] = {"columns": result.columns, "rows": result.records()}
    if result.total is not None:
        payload["total"] = result.total
    return payload


def only(params: MultiMapping[str], allowed: set[str]) -> dict[str, str]:
    """The query string as one value per key; an unknown or repeated key is a 400
    (a filter given twice would otherwise keep one value and drop the other unseen)."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise BadInput(f"unknown parameter {unknown[0]!r}")
    repeated = sorted(key for key in set(params) if len(params.getall(key)) > 1)
    if repeated:
        raise BadInput(f"repeated parameter {repeated[0]!r}: give each parameter once")
    return {key: params[key] for key in params}


class Api:
    def __init__(self, store: Store, runner: QueryRunner) -> None:
        self.store = store
        self.runner = runner

    def routes(self) -> list[web.RouteDef]:
        cached = self._cached
        return [
            web.get("/api/info", self.info),
            web.get("/api/overview", cached(self._overview, set())),
            web.get("/api/op_counts", cached(self._op_counts, set())),
            web.get("/api/aggregate", cached(self._aggregate, {"by", "limit"})),
            web.get("/api/tasks", cached(self._tasks, TASK_PARAMS)),
            web.get("/api/task", cached(self._task, {"task_id", "attempt", "session"})),
            web.get("/api/runs", cached(self._runs, set())),
            web.get("/api/steps", cached(self._steps, {"run"})),
            web.get("/api/traces", cached(self._traces, {"limit"})),
            web.get("/api/trace", cached(self._trace, {"trace_id"})),
            web.get("/api/agents", cached(self._agents, set())),
            web.get("/api/search", cached(self._search, {"q", "limit"})),
            web.get("/api/ledger", self.ledger),
        ]

    async def info(self, request: web.Request) -> web.Response:
        message = ""
        try:
            await self.runner.refresh()
        except NoData as exc:
            message = exc.message
        return web.json_response({**self.store.describe(), "message": message,
                                  "refresh_s": self.store.options.refresh_s})

    async def ledger(self, request: web.Request) -> web.Response:
        """A run's requests. Not cached: whether one is outstanding depends on the clock."""
        params = only(request.query, {"run", "outstanding_after"})
        return web.json_response(await self.runner.run(lambda: self._ledger(params)))

    def _ledger(self, params: dict[str, str]) -> Any:
        if "run" not in params:
            raise BadInput("run is required")
        try:
            after = parse_duration(params.get("outstanding_after", "5m"))
        except ValueError as exc:
            raise BadInput(f"outstanding_after: {exc}") from None
        run = params["run"]
        summary = self.store.execute(*ledger.summary_query(run, after))
        waiting = self.store.execute(*ledger.outstanding_query(run, after, limit=100))
        return {"summary": json_result(summary), "outstanding": json_result(waiting)}

    def _cached(self, compute: Callable[[dict[str, str]], Any], allowed: set[str]) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            params = only(request.query, allowed)
            payload = await self.runner.cached(request.path, params, lambda: compute(params))
            return web.json_response(payload)

        return handler

    # Each computation below runs in a worker thread (QueryRunner), never on the loop.

    def _overview(self, _params: dict[str, str]) -> Any:
        return overview(self.store)

    def _op_counts(self, _params: dict[str, str]) -> Any:
        return op_counts(self.store)

    def _aggregate(self, params: dict[str, str]) -> Any:
        limit = bounded_int("limit", params.get("limit"), 200, 1, 5000)
        by = params.get("by", "name")
        return {**json_result(queries.aggregate(self.store, by, limit)),
                "no_value": queries.NO_VALUE_LABELS.get(by, queries.NO_VALUE_LABEL)}

    def _tasks(self, params: dict[str, str]) -> Any:
        limit, offset = queries.page_args(params)
        filters = {k: v for k, v in params.items()
                   if k not in ("sort", "order", "limit", "offset", "q")}
        if params.get("q"):
            filters["text"] = params["q"]
        flt = TaskFilter.from_mapping(filters)
        page = queries.tasks(self.store, flt, sort=params.get("sort"), order=params.get("order"),
                             limit=limit, offset=offset)
        return {**json_result(page), "limit": limit, "offset": offset}

    def _task(self, params: dict[str, str]) -> Any:
        if not params.get("task_id"):
            raise BadInput("task_id is required")
        attempt = None
        if params.get("attempt", "") != "":
            attempt = bounded_int("attempt", params["attempt"], 0, 0, 2**31 - 1)
        return queries.task_detail(self.store, params["task_id"], attempt,
                                   params.get("session") or None)

    def _runs(self, _params: dict[str, str]) -> Any:
        return {**json_result(queries.runs(self.store)), "no_run": queries.NO_RUN}

    def _steps(self, params: dict[str, str]) -> Any:
        if "run" not in params:
            raise BadInput("run is required")
        run = params["run"]
        return {"steps": json_result(queries.steps(self.store, run)),
                "ops": json_result(queries.step_ops(self.store, run)),
                "metrics": json_result(queries.step_metrics(self.store, run)),
                "no_run": queries.NO_RUN}

    def _traces(self, params: dict[str, str]) -> Any:
        limit = bounded_int("limit", params.get("limit"), 100, 1, 5000)
        return json_result(queries.traces(self.store, limit))

    def _trace(self, params: dict[str, str]) -> Any:
        if not params.get("trace_id"):
            raise BadInput("trace_id is required")
        return json_result(queries.trace(self.store, params["trace_id"]))

    def _agents(self, _params: dict[str, str]) -> Any:
        return {"agents": json_result(queries.agents(self.store)),
                "losses": json_result(queries.losses(self.store))}

    def _search(self, params: dict[str, str]) -> Any:
        limit = bounded_int("limit", params.get("limit"), 100, 1, 1000)
        return json_result(queries.search(self.store, params.get("q", ""), limit))
