"""Ray's log routes, answered from the log pieces the agents kept (docs/ray-logs.md).

`GET /api/v0/logs/file` (and `/stream`: on a store nothing grows, so the same bytes)
takes the parameters Ray's client sends (`ray.util.state.get_log`) and answers with the
bytes of the range as Ray's dashboard does: text/plain, as an attachment named
`download_filename`. `GET /api/v0/logs` lists a node's stored files in Ray's groups.
Under `/ray/<session>/...` for another session than the newest, as the other routes.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from dashboard.lake.errors import BadInput, DashboardError
from dashboard.lake.store import Store
from dashboard.questions.runner import QueryRunner
from dashboard.raystate import sessions
from dashboard.raystate.logarchive import LogArchive
from dashboard.raystate.logfind import DEFAULT_LINES, LogAsk, node_of_ip, read_log
from dashboard.raystate.options import refusal, reply

DEFAULT_DOWNLOAD = "file.txt"  # Ray's DEFAULT_DOWNLOAD_FILENAME


class RayLogRoutes:
    def __init__(self, store: Store, runner: QueryRunner) -> None:
        self.store = store
        self.runner = runner
        self.archive = LogArchive(store.options)

    def routes(self) -> list[web.RouteDef]:
        found = []
        for prefix in ("", "/ray/{session}"):
            found.append(web.get(f"{prefix}/api/v0/logs", self.list_files))
            found.append(web.get(f"{prefix}/api/v0/logs/{{media_type}}", self.file))
        return found

    async def file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["media_type"] not in ("file", "stream"):
            return web.Response(status=404, text="Ray's log routes are /api/v0/logs/file "
                                                 "and /api/v0/logs/stream")
        try:
            ask = log_ask(request.query)
            data = await self._in_session(request, lambda session: read_log(
                self.store, self.archive, session, ask), task_id=ask.task_id,
                actor_id=ask.actor_id, node_id=ask.node_id)
        except DashboardError as exc:  # Ray's client shows the answer's text as is
            return web.Response(status=exc.status, text=exc.message)
        name = request.query.get("download_filename", DEFAULT_DOWNLOAD).replace('"', "")
        return web.Response(body=data, content_type="text/plain", charset="utf-8",
                            headers={"Content-Disposition": f'attachment; filename="{name}"'})

    async def list_files(self, request: web.Request) -> web.Response:
        node_id = request.query.get("node_id") or None
        node_ip = request.query.get("node_ip") or None
        if not node_id and not node_ip:
            return refusal("Both node id and node ip are not provided. Please provide at "
                           "least one of them.", 400)
        pattern = request.query.get("glob", "*")
        try:
            names = await self._in_session(request, lambda session: self._names(
                session, node_id, node_ip), node_id=node_id)
        except DashboardError as exc:
            return refusal(exc.message, exc.status)
        return reply(categorized([n for n in names if fnmatch.fnmatch(n, pattern)]))

    def _names(self, session: str, node_id: str | None, node_ip: str | None) -> list[str]:
        node = node_id or node_of_ip(self.store, session, node_ip)
        return sorted({f.name for f in self.archive.files(session, node or "_")})

    async def _in_session(self, request: web.Request, work: Callable[[str], Any], *,
                          task_id: str | None = None, actor_id: str | None = None,
                          node_id: str | None = None) -> Any:
        """`work` in the session the address names (/ray/<session>/...), else in the one
        that ran the task, actor or node asked about, else the newest."""
        wanted = request.match_info.get("session")
        timeout = _number(request.query.get("timeout", "30"), "timeout")
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can lose a cancel
                return await self.runner.run(lambda: work(sessions.choose_for(
                    self.store, wanted, task_id=task_id, actor_id=actor_id,
                    node_id=node_id)))
        except TimeoutError:
            raise DashboardError(f"evagg did not answer within the request's timeout of "
                                 f"{timeout:g} s", 500) from None


def log_ask(query: Mapping[str, str]) -> LogAsk:
    """Ray's GetLogOptions from the query string, with Ray's defaults."""
    if query.get("submission_id"):
        raise BadInput("evagg does not serve submission job logs: they lived in the head "
                       "node's job manager", 404)
    pid = query.get("pid")
    return LogAsk(
        task_id=query.get("task_id") or None,
        attempt_number=int(_number(query.get("attempt_number", "0"), "attempt_number")),
        actor_id=query.get("actor_id") or None,
        node_id=query.get("node_id") or None,
        node_ip=query.get("node_ip") or None,
        filename=query.get("filename") or None,
        pid=int(_number(pid, "pid")) if pid else None,
        suffix=query.get("suffix", "out"),
        lines=int(_number(query.get("lines", str(DEFAULT_LINES)), "lines")),
        filter_ansi_code=query.get("filter_ansi_code", "false").lower() == "true",
    )


def categorized(names: list[str]) -> dict[str, list[str]]:
    """Ray's groups of a node's files (LogsManager._categorize_log_files)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        groups[_group(name)].append(name)
    return dict(groups)


def _group(name: str) -> str:
    if "worker" in name and name.endswith(".out"):
        return "worker_out"
    if "worker" in name and name.endswith(".err"):
        return "worker_err"
    rules = (("core-worker", "core_worker"), ("core-driver", "driver"), ("raylet.", "raylet"),
             ("gcs_server.", "gcs_server"), ("log_monitor", "internal"),
             ("monitor", "autoscaler"), ("agent.", "agent"), ("dashboard.", "dashboard"))
    return next((group for part, group in rules if part in name), "internal")


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise BadInput(f"{what} must be a number, not {text!r}") from None
