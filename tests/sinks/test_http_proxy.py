"""The HTTP sink through a real forward proxy (tests/sinks/forward_proxy.py): an explicit
`proxy` URL, the environment's HTTP(S)_PROXY and NO_PROXY by default, "none" to go
direct whatever the environment says, an https:// endpoint through a CONNECT tunnel,
and a proxy that is down as a retried failure."""

from __future__ import annotations

import asyncio
import base64
import functools
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sinks.deadletter import replay_dead_letters
from sinks.http import HttpSink, HttpSinkConfigError
from sinks.http_proxy import proxy_route
from sinks.http_tls import TlsOptions
from tests.sinks.certs import make_pki
from tests.sinks.flaky_server import FlakyServer
from tests.sinks.forward_proxy import ForwardProxy
from tests.sinks.test_http import deliver, make_records


def synced(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body in its own event loop; its arguments stay pytest fixtures."""
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))  # type: ignore[arg-type]

    return wrapper


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def delivered_through(proxy_option: str, server: FlakyServer,
                            tls: TlsOptions | None = None) -> int:
    """Events the endpoint got from a sink set to `proxy_option`."""
    sink = HttpSink("collector", server.url, spool_id="spool-a", timeout_s=5.0,
                    proxy=proxy_option, tls=tls)
    assert await deliver(sink, make_records(2, 25)) == []
    await sink.close()
    return len(server.event_ids)


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
async def test_credentials_in_the_proxy_url_authenticate_and_are_never_shown() -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    with_credentials = proxy.url.replace("http://", "http://agent:s3cret@")
    try:
        assert await delivered_through(with_credentials, server) == 50
        shown = HttpSink("c", server.url, spool_id="s", proxy=with_credentials).describe()
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.credentials[0] == "Basic " + base64.b64encode(b"agent:s3cret").decode()
    assert "s3cret" not in shown and f"via {proxy.url}" in shown
    assert all("Proxy-Authorization" not in request.headers for request in server.requests)


@synced
async def test_an_https_endpoint_is_reached_through_a_connect_tunnel(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    proxy = await ForwardProxy().start()
    server = await FlakyServer(ssl_context=pki.server_context()).start()
    try:
        delivered = await delivered_through(proxy.url, server, TlsOptions(ca_file=str(pki.ca.cert)))
    finally:
        await server.stop()
        await proxy.stop()
    assert delivered == 50 and proxy.targets[0] == f"CONNECT 127.0.0.1:{server.port}"


@synced
async def test_by_default_the_environment_names_the_proxy_and_no_proxy_bypasses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        assert await delivered_through("env", server) == 50
        assert proxy.targets == [f"POST {server.url}"]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        server.event_ids.clear()
        assert await delivered_through("env", server) == 50
        assert len(proxy.targets) == 1  # direct this time
    finally:
        await server.stop()
        await proxy.stop()


@synced
async def test_an_environment_proxy_without_a_scheme_is_http_as_curl_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    try:
        monkeypatch.setenv("http_proxy", f"127.0.0.1:{proxy.port}")
        assert await delivered_through("env", server) == 50
    finally:
        await server.stop()
        await proxy.stop()
    assert proxy.targets == [f"POST {server.url}"]


def test_an_environment_proxy_that_is_not_http_stops_the_start_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(HttpSinkConfigError, match="from the HTTPS_PROXY variable"):
        HttpSink("collector", "https://127.0.0.1:9/ingest", spool_id="s")


@synced
async def test_none_goes_direct_whatever_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        assert await delivered_through("none", server) == 50
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
        sink = HttpSink("collector", server.url, spool_id="s", timeout_s=5.0, proxy=proxy.url)
        result = await sink.write(make_records(1, 5))
        if result.ok:
            result = await sink.flush(final=True)
        await sink.close()
    finally:
        await server.stop()
    assert (result.ok, result.error_kind, result.permanent) == (False, "connect", False)
    assert server.requests == []


@pytest.mark.parametrize("value", ["socks5://127.0.0.1:1080", "proxy:3128", "http://:3128",
                                   "http://127.0.0.1:port"])
def test_a_proxy_that_is_not_env_none_or_an_http_url_stops_the_start(value: str) -> None:
    with pytest.raises(HttpSinkConfigError, match="proxy"):
        HttpSink("collector", "http://127.0.0.1:9/ingest", spool_id="s", proxy=value)


@synced
async def test_dlq_replay_goes_through_the_sinks_proxy(tmp_path: Path) -> None:
    proxy, server = await ForwardProxy().start(), await FlakyServer().start()
    route = proxy_route(server.url, proxy.url.replace("http://", "http://agent:pw@"))
    try:
        server.answer(400, text="refused once")
        sink = HttpSink("collector", server.url, spool_id="s", timeout_s=5.0,
                        proxy=proxy.url, dead_letter_dir=tmp_path / "dlq")
        assert await deliver(sink, make_records(1, 5)) == []
        await sink.close()
        before = len(proxy.credentials)
        replayed = await replay_dead_letters(tmp_path / "dlq", server.url, proxy=route)
    finally:
        await server.stop()
        await proxy.stop()
    assert (replayed.sent, replayed.failed) == (1, 0) and len(server.event_ids) == 5
    assert len(proxy.credentials) == before + 1  # the replay's request carried them


def test_check_config_names_a_bad_proxy(tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"
    config.write_text(f"""
[agent]
state_dir = "{tmp_path / 'state'}"
http_listen = ""

[[sinks]]
name = "collector"
type = "http"
url = "http://127.0.0.1:9/ingest"
proxy = "socks5://127.0.0.1:1080"
""")
    done = subprocess.run([sys.executable, "-m", "aggregator", "check-config", "--config",
                           str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert 'proxy: must be "env", "none" or an http:// URL' in done.stderr + done.stdout
