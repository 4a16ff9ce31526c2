"""Hostile clients of a real `evagg dashboard`, whose port every local user reaches: a
request whose headers never end, and connections opened by the hundred and held. Each
costs the dashboard a file descriptor for as long as the client likes, and DuckDB needs
descriptors to read the store. A request's headers must come within 10 s, and
connections beyond the cap are closed at once, so the operator's page still answers
(docs/security.md, "Web pages")."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.commands import evagg
from tests.dashboard.dashproc import running_dashboard
from tests.dashboard.lakegen import Expected, local_put, write_sample_store
from tests.limits import (
    descriptor_limits,
    held_connections,
    runs_with_fewer_descriptors,
    with_fewer_descriptors,
)
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    lake = tmp_path_factory.mktemp("lake")
    write_sample_store(local_put(lake))
    # --refresh 0: every request lists the store again and opens its files
    with running_dashboard(lake, lake.parent, "--refresh", "0",
                           prefix=tuple(with_fewer_descriptors())) as started:
        assert runs_with_fewer_descriptors(started.pid), descriptor_limits(started.pid)
        yield started.port


def tcp(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_headers_that_never_end_are_cut_off(dashboard: int) -> None:
    sock = tcp(dashboard)
    sock.sendall(b"GET /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    sock.settimeout(0.5)
    deadline = time.monotonic() + 20  # aiohttp's own default held it 75 s
    closed = False
    while not closed and time.monotonic() < deadline:
        try:
            closed = sock.recv(65536) == b""
        except TimeoutError:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                closed = True
        except ConnectionResetError:
            closed = True
    sock.close()
    assert closed, "a request whose headers never end holds its connection"


def tasks_page(connection: http.client.HTTPConnection, offset: int) -> tuple[int, bytes]:
    """A page of the task table: a different offset each time, so no cached answer."""
    connection.request("GET", f"/api/tasks?limit=5&offset={offset}")
    answer = connection.getresponse()
    return answer.status, answer.read()


def test_held_connections_leave_the_operators_page_answering(dashboard: int) -> None:
    operator = http.client.HTTPConnection("127.0.0.1", dashboard, timeout=60)
    assert tasks_page(operator, 0)[0] == 200  # the operator's page, open before the flood
    try:
        with held_connections(dashboard):  # more than the dashboard's descriptors
            status, body = tasks_page(operator, 1)
    finally:
        operator.close()
    assert status == 200, body[:300]
    page = json.loads(body)
    assert page["total"] == Expected.tasks and len(page["rows"]) == 5


def served(connection: http.client.HTTPConnection) -> bool:
    """Whether the dashboard answers a request on `connection` (kept open after)."""
    try:
        connection.request("GET", "/api/info")
        answer = connection.getresponse()
        answer.read()
    except OSError:
        return False
    return answer.status == 200


def served_anew(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        return served(connection)
    finally:
        connection.close()


def test_max_connections_caps_what_a_client_can_hold(tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    """`--max-connections 3`: a client holding 3 connections (each served, kept alive)
    gets no answer on a 4th; once it lets one go, a new one is served."""
    lake = tmp_path_factory.mktemp("capped")
    write_sample_store(local_put(lake))
    with running_dashboard(lake, lake.parent, "--max-connections", "3") as started:
        held = [http.client.HTTPConnection("127.0.0.1", started.port, timeout=30)
                for _ in range(3)]
        try:
            assert all(served(connection) for connection in held)  # each one counted
            # a 4th is closed unanswered (under the cap, the same request gets a 200)
            assert not served_anew(started.port), "a 4th connection was served"
            assert all(served(connection) for connection in held)  # the 3 still answer
            held.pop().close()
            wait_for(lambda: served_anew(started.port), 30,
                     "a connection under the cap to be served")
        finally:
            for connection in held:
                connection.close()
        assert "closing connections beyond 3 open at once" in started.log()


def test_max_connections_is_explained_and_checked() -> None:
    shown = evagg("dashboard", "--help")
    assert shown.returncode == 0
    flat = " ".join(shown.stdout.split())
    assert "--max-connections N connections served at once" in flat, flat
    assert "(default 256:" in flat, flat  # as before the flag
    refused = evagg("dashboard", "--max-connections", "0", "--data", "/nonexistent")
    assert refused.returncode == 2
    assert "--max-connections must be 1 to 1000000, not 0" in refused.stderr
