"""The dashboard's artifact routes: a run's shipped files and one file's bytes.

    GET /api/artifacts?run=R                      the index (as `evagg query artifacts`)
    GET /api/artifact?name=N[&version=V][&node=]  the bytes, as an attachment

The bytes are streamed from the lake in a thread, chunk by chunk, never on the loop and
never whole in memory; a name the index does not know is a 404 that says so.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web

from dashboard.lake.errors import BadInput
from dashboard.lake.store import Store
from dashboard.questions import artifacts
from dashboard.questions.filters import bounded_int
from dashboard.questions.runner import QueryRunner
from dashboard.web.api import json_result, only

CHUNK: Final = 1024 * 1024


class ArtifactApi:
    def __init__(self, store: Store, runner: QueryRunner) -> None:
        self.store = store
        self.runner = runner

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/api/artifacts", self.listing), web.get("/api/artifact", self.download)]

    async def listing(self, request: web.Request) -> web.Response:
        params = only(request.query, {"run"})
        payload = await self.runner.cached(request.path, params, lambda: json_result(
            artifacts.artifacts(self.store, run=params.get("run"))))
        return web.json_response(payload)

    async def download(self, request: web.Request) -> web.StreamResponse:
        params = only(request.query, {"name", "version", "node"})
        if not params.get("name"):
            raise BadInput("name is required (a name from /api/artifacts)")
        version = (bounded_int("version", params["version"], 1, 1, 2**31 - 1)
                   if params.get("version") else None)
        row: dict[str, Any] = await self.runner.run(lambda: artifacts.choose(
            self.store, params["name"], version, params.get("node")))
        with artifacts.opened(self.store.options, row["lake_key"]) as stream:
            first = await asyncio.to_thread(stream.read, CHUNK)
            response = web.StreamResponse(headers={
                "Content-Type": "application/octet-stream",
                "Content-Disposition": _attachment(row["name"].rsplit("/", 1)[-1]),
                "Content-Length": str(row["size_bytes"]),
                "X-Evagg-Sha256": row["sha256"]})
            await response.prepare(request)
            while first:
                await response.write(first)
                first = await asyncio.to_thread(stream.read, CHUNK)
        await response.write_eof()
        return response


def _attachment(file_name: str) -> str:
    return f"attachment; filename*=UTF-8''{quote(file_name)}"
