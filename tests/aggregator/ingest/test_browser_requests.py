"""A web page open in the operator's browser against a real agent's loopback HTTP port.

Without a token (the default) the port takes events from any local client. A page can
POST to it across sites without asking (a text/plain body is a "simple" request, sent
before any CORS check), and a page whose own name an attacker re-points at 127.0.0.1
(DNS rebinding) reads /v1/tail and /metrics as its own. The agent serves no page, so it
refuses any request with an Origin header, and on loopback any Host that does not name
this machine; what such a request carried is not stored."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from tests.agentproc import AgentProcess

EVENT = b'{"kind": "op", "name": "%s", "state": "FINISHED"}\n'


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with AgentProcess(tmp_path_factory.mktemp("browser")) as started:
        yield started


def ask(agent: AgentProcess, method: str, path: str, headers: dict[str, str],
        body: bytes | None = None) -> tuple[int, bytes]:
    """One request as a browser would send it, headers as given (Host too)."""
    connection = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host="Host" in headers,
                              skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        # the tail streams: its first bytes or its refusal are enough
        return answer.status, answer.read() if answer.status != 200 else b""
    finally:
        connection.close()


def test_a_cross_site_post_from_a_page_is_refused_and_not_stored(agent: AgentProcess) -> None:
    status, text = ask(agent, "POST", "/v1/events", {
        "Host": f"127.0.0.1:{agent.port}", "Origin": "https://evil.example",
        "Content-Type": "text/plain"}, EVENT % b"forged-by-a-page")
    assert status == 403, text
    assert b"Origin" in text
    status, _ = ask(agent, "POST", "/v1/events", {
        "Host": f"127.0.0.1:{agent.port}", "Content-Type": "application/x-ndjson"},
        EVENT % b"from-a-producer")
    assert status == 200
    agent.wait_rows("SELECT * FROM events WHERE name = 'from-a-producer'", 1)
    assert agent.query("SELECT count(*) FROM events WHERE name = 'forged-by-a-page'") == [(0,)]
    assert agent.metric('evagg_bad_input_total{reason="browser_request",'
                        'route="/v1/events"}') >= 1


@pytest.mark.parametrize("path", ["/v1/tail", "/metrics", "/v1/events"])
def test_a_rebound_name_cannot_read_or_write_the_port(agent: AgentProcess, path: str) -> None:
    method, body = ("POST", EVENT % b"rebound") if path == "/v1/events" else ("GET", None)
    status, text = ask(agent, method, path, {"Host": f"rebind.evil.example:{agent.port}"},
                       body)
    assert status == 403, text
    assert b"does not name this machine" in text


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST"])
def test_loopback_names_are_answered(agent: AgentProcess, host: str) -> None:
    assert ask(agent, "GET", "/metrics", {"Host": f"{host}:{agent.port}"})[0] == 200
    assert ask(agent, "GET", "/healthz", {"Host": host})[0] == 200


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_get_from_another_sites_page_is_refused(agent: AgentProcess, site: str) -> None:
    """An <img src> on a page opens /v1/tail with no Origin; the browser says whose page
    asked (Sec-Fetch-Site). same-site: a page on another port of 127.0.0.1."""
    before = agent.metric('evagg_bad_input_total{reason="browser_request",route="/v1/tail"}')
    status, text = ask(agent, "GET", "/v1/tail", {
        "Host": f"127.0.0.1:{agent.port}", "Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors",
        "Sec-Fetch-Dest": "image"})
    assert status == 403, text
    assert f"Sec-Fetch-Site: {site}".encode() in text
    assert agent.metric('evagg_bad_input_total{reason="browser_request",'
                        'route="/v1/tail"}') == before + 1


def test_an_address_typed_in_the_browser_is_answered(agent: AgentProcess) -> None:
    assert ask(agent, "GET", "/metrics", {"Host": f"127.0.0.1:{agent.port}",
                                          "Sec-Fetch-Site": "none"})[0] == 200
