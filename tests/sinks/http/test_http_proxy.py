"""The HTTP sink through a real forward proxy (tests/sinks/forward_proxy.py): an explicit
`proxy` URL, the environment's HTTP(S)_PROXY and NO_PROXY by default (loopback endpoints
always direct), "none" to go direct whatever the environment says, an https:// endpoint
through a CONNECT tunnel, credentials that reach the proxy and nothing else, a proxy that
refuses them (407) or is down."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from sinks.base import SinkResult
from sinks.http import HttpOptions, HttpSink, HttpSinkConfigError
from sinks.http.proxy import proxy_route
from sinks.http.replay import replay_dead_letters
from sinks.http.tls import TlsOptions
from tests.commands import check_config
from tests.sinks.certs import make_pki
from tests.sinks.flaky_server import FlakyServer
from tests.sinks.forward_proxy import ForwardProxy
from tests.sinks.http.records import deliver, make_records
from tests.sinks.http_config_file import http_sink_config
from tests.sinks.synced import synced

NAME = "collector.test"  # an endpoint only the proxy can resolve (to 127.0.0.1)
BASIC = "Basic " + base64.b64encode(b"agent:s3cret").decode()


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def named(server: FlakyServer) -> str:
    return server.url.replace("127.0.0.1", NAME)


def with_credentials(proxy: ForwardProxy) -> str:
    return proxy.url.replace("http://", "http://agent:s3cret@")


async def delivered_through(proxy_option: str, server: FlakyServer, url: str | None = None,
                            tls: TlsOptions | None = None) -> int:
    """Events the endpoint got from a sink set to `proxy_option`, sending to `url`."""
    options = HttpOptions(timeout_s=5.0, proxy=proxy_option, tls=tls or TlsOptions())
    sink = HttpSink("collector", url or server.url, options, spool_id="spool-a")
    assert await deliver(sink, make_records(2, 25)) == []
    await sink.close()
    return len(server.event_ids)


async def one_attempt(sink: HttpSink) -> SinkResult:
    result = await sink.write(make_records(1, 5))
    if result.ok:
        result = await sink.flush(final=True)
    await sink.close()
    return result


@synced
async def test_an_explicit_proxy_carries_every_request() -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    try:
        assert await delivered_through(proxy.url, server) == 50
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.targets and proxy.targets[0] == f"POST {server.url}"


@synced
async def test_credentials_reach_the_proxy_on_an_http_request_and_are_never_shown() -> None:
    proxy, server = await ForwardProxy(required=BASIC).start(), await FlakyServer().start()
    try:
        assert await delivered_through(with_credentials(proxy), server) == 50
        shown = HttpSink("c", server.url, HttpOptions(proxy=with_credentials(proxy)), spool_id="s")
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.credentials[0] == BASIC
    assert "s3cret" not in shown.describe() and f"via {proxy.url}" in shown.describe()
    route = proxy_route(server.url, with_credentials(proxy))
    assert "s3cret" not in repr(route) and BASIC not in repr(route)


@synced
async def test_an_https_endpoint_is_reached_through_a_connect_tunnel_with_the_credentials(
        tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    proxy = await ForwardProxy(required=BASIC).start()
    server = await FlakyServer(ssl_context=pki.server_context()).start()
    try:
        delivered = await delivered_through(with_credentials(proxy), server,
                                            tls=TlsOptions(ca_file=str(pki.ca.cert)))
    finally:
        await server.stop()
        await proxy.stop()
    assert delivered == 50 and proxy.targets[0] == f"CONNECT 127.0.0.1:{server.port}"
    assert proxy.credentials[0] == BASIC  # on the CONNECT, for the proxy
    assert all("Proxy-Authorization" not in seen.headers for seen in server.requests)


@synced
async def test_a_proxy_that_refuses_the_credentials_keeps_the_data_spooled(
        tmp_path: Path) -> None:
    """407 is about the proxy, not the batch: never a dead letter, a permanent auth error."""
    pki = make_pki(tmp_path / "pki")
    proxy = await ForwardProxy(required=BASIC).start()
    plain, tls_server = await FlakyServer().start(), await FlakyServer(
        ssl_context=pki.server_context()).start()
    wrong = proxy.url.replace("http://", "http://agent:wrong@")
    try:
        for server, tls in ((plain, TlsOptions()),
                            (tls_server, TlsOptions(ca_file=str(pki.ca.cert)))):
            sink = HttpSink("collector", server.url,
                            HttpOptions(timeout_s=5.0, proxy=wrong, tls=tls), spool_id="s",
                            dead_letter_dir=tmp_path / "dlq")
            result = await one_attempt(sink)
            assert (result.ok, result.error_kind, result.permanent) == (False, "http_auth", True)
            assert "proxy" in (result.error or "")
    finally:
        for running in (plain, tls_server, proxy):
            await running.stop()
    assert not (tmp_path / "dlq").exists() and plain.requests == tls_server.requests == []


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy"])
@pytest.mark.parametrize("scheme", ["http://", ""])  # curl takes "host:port" for http://
@synced
async def test_by_default_the_environment_names_the_proxy(
        variable: str, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = await ForwardProxy(hosts={NAME: "127.0.0.1"}).start()
    server = await FlakyServer().start()
    try:
        monkeypatch.setenv(variable, f"{scheme}127.0.0.1:{proxy.port}")
        assert await delivered_through("env", server, named(server)) == 50
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.targets == [f"POST {named(server)}"]


@synced
async def test_loopback_endpoints_go_direct_whatever_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        assert await delivered_through("env", server) == 50  # 127.0.0.1
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.targets == []
    for host in ("localhost", "[::1]", "127.0.0.2", "agent.localhost"):
        assert proxy_route(f"http://{host}:4318/v1", "env").url is None


def test_no_proxy_bypasses_the_environment_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    assert proxy_route(f"https://{NAME}/ingest", "env").url == "http://proxy.corp:3128"
    monkeypatch.setenv("NO_PROXY", ".test,.internal")
    assert proxy_route(f"https://{NAME}/ingest", "env").url is None
    assert proxy_route("https://collector.example/ingest", "env").url == "http://proxy.corp:3128"


@synced
async def test_none_goes_direct_whatever_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = await ForwardProxy(hosts={NAME: "127.0.0.1"}).start()
    server = await FlakyServer().start()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        assert await delivered_through("none", server) == 50
        assert proxy_route(named(server), "none").url is None
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.targets == []


@synced
async def test_a_proxy_that_is_down_is_a_retried_connect_failure() -> None:
    proxy = await ForwardProxy().start()
    await proxy.stop()  # its port now refuses connections
    server = await FlakyServer().start()
    try:
        result = await one_attempt(HttpSink(
            "collector", server.url, HttpOptions(timeout_s=5.0, proxy=proxy.url), spool_id="s"))
    finally:
        await server.stop()
    assert (result.ok, result.error_kind, result.permanent) == (False, "connect", False)
    assert server.requests == []


@synced
async def test_dlq_replay_goes_through_the_sinks_proxy(tmp_path: Path) -> None:
    proxy = await ForwardProxy(required=BASIC).start()
    server = await FlakyServer().start()
    route = proxy_route(server.url, with_credentials(proxy))
    try:
        server.answer(400, text="refused once")
        sink = HttpSink("collector", server.url,
                        HttpOptions(timeout_s=5.0, proxy=with_credentials(proxy)), spool_id="s",
                        dead_letter_dir=tmp_path / "dlq")
        assert await deliver(sink, make_records(1, 5)) == []
        await sink.close()
        before = len(proxy.targets)
        replayed = await replay_dead_letters(tmp_path / "dlq", server.url, proxy=route)
    finally:
        await server.stop()
        await proxy.stop()
    assert (replayed.sent, replayed.failed) == (1, 0) and len(server.event_ids) == 5
    assert len(proxy.targets) == before + 1  # the replay's own connection, authenticated


@pytest.mark.parametrize("value", ["socks5://127.0.0.1:1080", "proxy:3128", "http://:3128",
                                   "http://127.0.0.1:port"])
def test_a_proxy_that_is_not_env_none_or_an_http_url_stops_the_start(value: str) -> None:
    with pytest.raises(HttpSinkConfigError, match="proxy"):
        HttpSink("collector", "http://127.0.0.1:9/ingest", HttpOptions(proxy=value),
                 spool_id="s")


def test_a_refused_proxy_value_with_credentials_is_not_echoed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HttpSinkConfigError) as refused:
        HttpSink("collector", "http://127.0.0.1:9/ingest",
                 HttpOptions(proxy="agent:s3cret@proxy.corp:3128"),  # curl's form, not a URL
                 spool_id="s")
    assert "s3cret" not in str(refused.value)
    monkeypatch.setenv("HTTPS_PROXY", "socks5://agent:s3cret@127.0.0.1:1080")
    with pytest.raises(HttpSinkConfigError, match="from the HTTPS_PROXY variable") as refused:
        HttpSink("collector", f"https://{NAME}/ingest", spool_id="s")
    assert "s3cret" not in str(refused.value)


def test_check_config_names_a_bad_proxy(tmp_path: Path) -> None:
    config = http_sink_config(tmp_path, "http://127.0.0.1:9/ingest",
                              'proxy = "socks5://127.0.0.1:1080"')
    done = check_config("--config", str(config))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert 'proxy: must be "env", "none" or an http:// URL' in done.stderr + done.stdout
