"""Another site's page against a real `evagg dashboard`, in real headless Chromium: the
page's <img> at the dashboard's API makes it run nothing (the browser says
Sec-Fetch-Site: cross-site), while a link on that page still opens the dashboard, whose
own requests are answered (docs/security.md, "Web pages")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.dashboard.chromium import chromium, tab
from tests.dashboard.dashproc import Dashboard, running_dashboard
from tests.dashboard.lakegen import Expected, local_put, write_sample_store
from tests.waiting import wait_until

# localhost and 127.0.0.1 are two sites to a browser: the page is on one, the dashboard
# on the other
ANOTHER_SITE = """<!doctype html><html><body>
<img id="probe" src="http://127.0.0.1:{port}/api/tasks?search=asked-by-another-site">
<a id="link" href="http://127.0.0.1:{port}/#/tasks">the dashboard</a>
</body></html>"""


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    lake = tmp_path_factory.mktemp("lake")
    write_sample_store(local_put(lake))
    with running_dashboard(lake, lake.parent) as started:
        yield started


@pytest.fixture(scope="module")
def another_site(dashboard: Dashboard) -> Iterator[str]:
    page = ANOTHER_SITE.format(port=dashboard.port).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(30)


def test_another_sites_page_runs_no_query_but_its_link_opens_the_dashboard(
        dashboard: Dashboard, another_site: str) -> None:
    with chromium() as browser, tab(browser, another_site, width=1400, height=900) as page:
        page.goto("/")
        wait_until(lambda: "(cross_site) for '/api/tasks'" in dashboard.log(), 30,
                   lambda: f"the dashboard to refuse the page's requests: {dashboard.log()}")
        page.click("#link")
        expect(page.locator("#task-count")).to_have_text(f"{Expected.tasks} task attempts")
