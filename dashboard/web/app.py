"""The dashboard's aiohttp application: static pages, the JSON API, errors as JSON.

The pages (dashboard/web/static) are plain HTML, JS and CSS with no build step and nothing
fetched from a CDN. Errors reach the browser as {"error": message} with a 4xx/5xx
status, never as a stack trace.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from dashboard.lake.errors import DashboardError
from dashboard.lake.store import Store
from dashboard.questions.runner import QueryRunner
from dashboard.raystate.routes import RayStateApi
from dashboard.web.api import Api, Handler
from dashboard.web.artifact_routes import ArtifactApi
from emitters.ratelimit import RateLimitedLog
from sinks.listener import from_another_site
from sinks.locations import host_header_trusted

log = logging.getLogger("evagg.dashboard")
STATIC = Path(str(resources.files("dashboard.web").joinpath("static")))
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except DashboardError as exc:
        response = web.json_response({"error": exc.message}, status=exc.status)
    except web.HTTPException as exc:
        if not request.path.startswith("/api/"):
            raise
        text = "no such endpoint" if exc.status == 404 else exc.reason
        response = web.json_response({"error": text}, status=exc.status)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("request %s failed", request.path_qs)
        response = web.json_response(
            {"error": "internal error; the dashboard's log has the details"}, status=500)
    response.headers.update(SECURITY_HEADERS)
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return response


def only_this_machine(listen_host: str) -> Middleware:
    """Refuse what a web page other than the dashboard's own sends (docs/security.md, "Web
    pages"); each kind of refusal is logged once a minute with how many there were."""
    refusals = RateLimitedLog(log)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        kind, reason = refused_page_request(request, listen_host)
        if not kind:
            return await handler(request)
        refusals.log(logging.WARNING, kind, "refused a request from a web page (%s) for %r: "
                     "%s", kind, request.path[:100], reason)  # quoted: a page chose the path
        response = web.json_response({"error": reason}, status=403)
        response.headers.update(SECURITY_HEADERS)
        return response

    return check


def refused_page_request(request: web.Request, listen_host: str) -> tuple[str, str]:
    """(kind, reason) where a request comes from a page it must not serve, else ("", "").
    On a loopback port, a Host that does not name this machine is a page whose name was
    re-pointed at 127.0.0.1 (DNS rebinding), which would read every page and file of the
    store as its own. A page of another site (or port) may not make the dashboard query,
    but a link to its page from elsewhere (a chat, a wiki) opens it: only a top-level
    navigation to "/" is let through, and the page's own requests are same-origin."""
    host = request.headers.get("Host")
    if host is not None and not host_header_trusted(host, listen_host):
        return "rebound_host", (f"Host {host[:100]!r} does not name this machine; open "
                                "http://127.0.0.1:<port>/ or http://localhost:<port>/")
    site = from_another_site(request.headers)
    navigation = (request.headers.get("Sec-Fetch-Mode") == "navigate"
                  and request.headers.get("Sec-Fetch-Dest") == "document")
    if site and not (navigation and request.path == "/"):
        return "cross_site", (f"requests caused by another site's page are refused "
                              f"(Sec-Fetch-Site: {site}); open the dashboard's own address "
                              "and follow its links")
    return "", ""


async def index(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


def create_app(store: Store, *, timeout_s: float = 60.0,
               listen_host: str = "127.0.0.1") -> web.Application:
    runner = QueryRunner(store, timeout_s=timeout_s)
    app = web.Application(middlewares=[only_this_machine(listen_host), errors_as_json])
    app.add_routes(Api(store, runner).routes())
    app.add_routes(ArtifactApi(store, runner).routes())  # shipped files, docs/dashboard.md
    app.add_routes(RayStateApi(store, runner).routes())  # Ray's State API, docs/ray.md
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)

    async def close(_app: web.Application) -> None:
        runner.close()
        store.close()

    app.on_cleanup.append(close)
    return app
