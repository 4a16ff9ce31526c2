"""DNS rebinding against a real `evagg dashboard` on loopback: a web page whose own name
its author re-points at 127.0.0.1 sends its name as Host, and would read every page,
task, log and shipped file of the store as its own. Only names of this machine are
answered (docs/security.md, "Web pages")."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from tests.dashboard.dashproc import Dashboard, running_dashboard


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    lake = tmp_path_factory.mktemp("lake")
    with running_dashboard(lake, lake.parent) as running:
        yield running


@pytest.fixture(scope="module")
def dashboard(started: Dashboard) -> int:
    return started.port


def status(port: int, path: str, host: str, **fetch: str) -> tuple[int, bytes]:
    """A GET with this Host; `fetch`: the Sec-Fetch-* headers a browser adds (site=...)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", path, skip_host=True)
        connection.putheader("Host", host)
        for name, value in fetch.items():
            connection.putheader(f"Sec-Fetch-{name.title()}", value)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize("path", ["/", "/api/info", "/api/tasks", "/static/app.js",
                                  "/api/v0/logs?node_id=n"])
def test_a_rebound_page_reads_nothing(dashboard: int, path: str) -> None:
    code, body = status(dashboard, path, f"rebind.evil.example:{dashboard}")
    assert code == 403, body[:200]
    assert b"does not name this machine" in body


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}"])
def test_the_operators_own_addresses_are_served(dashboard: int, host: str) -> None:
    assert status(dashboard, "/api/info", host.format(port=dashboard))[0] == 200


def test_an_ssh_tunnel_on_another_local_port_is_served(dashboard: int) -> None:
    """`ssh -L 9000:127.0.0.1:8050 host` sends the laptop's port in the Host header."""
    assert status(dashboard, "/", "localhost:9000")[0] == 200



@pytest.mark.parametrize("site", ["cross-site", "same-site"])
@pytest.mark.parametrize(("path", "mode", "dest"), [
    ("/api/tasks?search=x", "no-cors", "image"),  # <img src> on another site's page
    ("/api/v0/tasks", "navigate", "document"),  # a link or form to the API
    ("/static/app.js", "no-cors", "script"),
])
def test_another_sites_page_makes_the_dashboard_do_nothing(
        started: Dashboard, site: str, path: str, mode: str, dest: str) -> None:
    code, body = status(started.port, path, f"127.0.0.1:{started.port}", site=site,
                        mode=mode, dest=dest)
    assert code == 403, body[:200]
    assert f"Sec-Fetch-Site: {site}".encode() in body
    assert "refused a request from a web page (cross_site)" in started.log()


@pytest.mark.parametrize(("site", "mode", "dest"), [
    ("cross-site", "navigate", "document"),  # a link to the dashboard in a chat or wiki
    ("none", "navigate", "document"),  # the address typed or bookmarked
])
def test_a_link_to_the_dashboard_opens_it(started: Dashboard, site: str, mode: str,
                                          dest: str) -> None:
    code, body = status(started.port, "/", f"localhost:{started.port}", site=site,
                        mode=mode, dest=dest)
    assert code == 200 and b"<html" in body.lower()


def test_the_pages_own_requests_are_answered(started: Dashboard) -> None:
    code, _ = status(started.port, "/api/info", f"localhost:{started.port}",
                     site="same-origin", mode="cors", dest="empty")
    assert code == 200
