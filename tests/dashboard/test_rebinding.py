"""DNS rebinding against a real `evagg dashboard` on loopback: a web page whose own name
its author re-points at 127.0.0.1 sends its name as Host, and would read every page,
task, log and shipped file of the store as its own. Only names of this machine are
answered (docs/security.md, "Web pages")."""

from __future__ import annotations

import http.client
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.agentproc import REPO
from tests.ports import free_port


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    lake = tmp_path_factory.mktemp("lake")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "aggregator", "dashboard", "--data",
                             str(lake), "--no-cache", "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # it says where it serves once the port is open
            if f"127.0.0.1:{port}" in line:
                break
        else:
            pytest.fail(f"the dashboard exited: {proc.wait()}")
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def status(port: int, path: str, host: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", path, skip_host=True)
        connection.putheader("Host", host)
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

