"""The aiohttp routes of Ray's State API, at `/api/v0/...` (the newest Ray session) and
at `/ray/<session>/api/v0/...` (that one; dashboard/raystate/sessions.py).

Point Ray's tools at the dashboard: `ray list tasks --address http://HOST:PORT`, or
`--address http://HOST:PORT/ray/<session>` for another session. Each answer is
computed in the query runner's threads, cached per store version like the dashboard's
own routes, and cut short after the request's `timeout` (Ray's default 30 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dashboard.lake.errors import DashboardError
from dashboard.lake.store import Store
from dashboard.questions.runner import QueryRunner
from dashboard.raystate import entities, sessions, tasks, timeline
from dashboard.raystate.logs import RayLogRoutes
from dashboard.raystate.options import (
    ListOptions,
    RayApiError,
    list_options,
    refusal,
    reply,
    summary_options,
)

log = logging.getLogger("evagg.dashboard.ray")
Compute = Callable[[Store, str, ListOptions], dict[str, Any]]
RAY_VERSION = "2.60.0"  # the Ray whose State API these answers follow


def _entities(resource: str) -> Compute:
    def compute(store: Store, session: str, options: ListOptions) -> dict[str, Any]:
        return entities.list_entities(store, session, resource, options)

    return compute


LISTS: dict[str, Compute] = {
    "tasks": tasks.list_tasks,
    **{name: _entities(name) for name in ("actors", "jobs", "nodes", "workers",
                                          "placement_groups")},
}
SUMMARIES: dict[str, Compute] = {"tasks": tasks.summarize_tasks,
                                 "actors": entities.summarize_actors}
# Ray's routes the store cannot answer: what they need lived in the cluster's memory or
# on its disks, and is not in the events Ray exports.
NOT_SERVED = {
    "objects": "objects are not exported by Ray: they lived in the cluster's object stores",
    "objects/summarize": "objects are not exported by Ray: they lived in the cluster's "
                         "object stores",
    "runtime_envs": "runtime environments are not exported by Ray's event export",
    "cluster_events": "cluster events are not exported by Ray's event export",
}


class RayStateApi:
    def __init__(self, store: Store, runner: QueryRunner) -> None:
        self.store = store
        self.runner = runner

    def routes(self) -> list[web.RouteDef]:
        found = [web.get("/api/ray/sessions", self.sessions),
                 web.get("/api/ray/timeline", self.lanes)]
        for prefix in ("", "/ray/{session}"):
            found.append(web.get(f"{prefix}/api/version", self.version))
            for name in SUMMARIES:
                found.append(web.get(f"{prefix}/api/v0/{name}/summarize",
                                     self._handler(name, SUMMARIES[name], summary_options)))
            found.append(web.get(f"{prefix}/api/v0/tasks/timeline", self.trace))
            for name in LISTS:
                found.append(web.get(f"{prefix}/api/v0/{name}",
                                     self._handler(name, LISTS[name], list_options)))
            for name, why in NOT_SERVED.items():
                found.append(web.get(f"{prefix}/api/v0/{name}", self._not_served(why)))
        return [*found, *RayLogRoutes(self.store, self.runner).routes()]  # logs.py

    @staticmethod
    def _not_served(why: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_request: web.Request) -> web.Response:
            return refusal(f"evagg does not serve this: {why} (docs/ray.md, \"What is "
                           "served\")", 404)

        return handler

    async def version(self, _request: web.Request) -> web.Response:
        """What Ray's job and state clients ask first when they connect."""
        return web.json_response({"version": "4", "ray_version": RAY_VERSION,
                                  "ray_commit": "evagg", "session_name": ""})

    def _handler(self, resource: str, compute: Compute,
                 parse: Callable[..., ListOptions]) -> Callable[[web.Request],
                                                               Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            try:
                options = parse(request.query, resource)
                payload = await self._answer(request, options.timeout_s,
                                             lambda session: compute(self.store, session,
                                                                     options))
            except (RayApiError, DashboardError) as exc:
                return refusal(exc.message, exc.status)
            except asyncio.CancelledError:
                raise
            except Exception:  # Ray's client reads only its envelope, even for a bug
                log.exception("Ray State API request %s failed", request.path_qs)
                return refusal("evagg failed to answer; the dashboard's log has the "
                               "details", 500)
            return reply(payload)

        return handler

    async def _answer(self, request: web.Request, timeout_s: float,
                      compute: Callable[[str], Any]) -> Any:
        wanted = request.match_info.get("session")

        def work() -> Any:
            return compute(sessions.choose(self.store, wanted))

        key = {"q": request.query_string, "session": wanted or ""}
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: it can lose a cancel
                return await self.runner.cached(request.path, key, work)
        except TimeoutError:
            raise RayApiError(f"evagg did not answer within the request's timeout of "
                              f"{timeout_s:g} s; ask again with a longer --timeout, or "
                              "narrow the list with filters", 500) from None

    async def trace(self, request: web.Request) -> web.Response:
        """Ray's `tasks/timeline` (the dashboard's Download timeline): a Chrome trace."""
        job = request.query.get("job_id", "")
        try:
            events = await self._answer(request, 60, lambda session: timeline.chrome_trace(
                self.store, session, job))
        except (RayApiError, DashboardError) as exc:
            return refusal(exc.message, exc.status)
        headers = {}
        if request.query.get("download") == "1":
            headers["Content-Disposition"] = f'attachment; filename="timeline-{job}.json"'
        return web.Response(text=json.dumps(events), content_type="application/json",
                            headers=headers)

    async def sessions(self, _request: web.Request) -> web.Response:
        found = await self.runner.run(lambda: sessions.sessions(self.store))
        return web.json_response({"sessions": found})

    async def lanes(self, request: web.Request) -> web.Response:
        """The dashboard's timeline page: a job's attempts as bars per worker."""
        session = request.query.get("session") or None
        job = request.query.get("job", "")

        def work() -> Any:
            job_id, chosen = sessions.job_in_session(self.store, job, session)
            return timeline.lanes(self.store, chosen, job_id)

        key = {"session": session or "", "job": job}
        payload = await self.runner.cached(request.path, key, work)
        return web.json_response(payload)
