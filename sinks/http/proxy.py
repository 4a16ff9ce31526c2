"""Which proxy the HTTP sink's requests go through, decided once when the sink is built.

"env" reads HTTP_PROXY, HTTPS_PROXY and NO_PROXY (either case) as curl does, except that
loopback endpoints always go direct (as Go's net/http does: a node-wide proxy variable
must not send a local collector's traffic off the node), "none" goes direct, anything
else is the proxy's URL. The sink has one endpoint, so the answer is
one route; a changed environment takes a reload or restart, like every other option.
Credentials in a proxy URL become the Proxy-Authorization header (Basic) and are never
shown.
"""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from sinks.http.endpoint import HttpSinkConfigError, url_for_display
from sinks.locations import is_loopback_host


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    url: str | None = None  # None: direct; never holds credentials
    # for the proxy, not the endpoint; never in repr: it holds the password in base64
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        return f", via {self.url}" if self.url else ""

    def for_endpoint(self, endpoint: str) -> tuple[dict[str, str], dict[str, Any]]:
        """(headers to add to every request, aiohttp's proxy arguments) on the way to
        `endpoint`: a proxy reads its credentials from the CONNECT request for https://,
        from the request itself for http://."""
        if self.url is None:
            return {}, {}
        if endpoint.startswith("https://"):
            return {}, {"proxy": self.url, "proxy_headers": dict(self.headers)}
        return dict(self.headers), {"proxy": self.url}


def proxy_route(endpoint: str, option: str) -> ProxyRoute:
    """The route to `endpoint` for the sink option `proxy` ("env", "none" or a URL)."""
    if option == "none":
        return ProxyRoute()
    if option != "env":
        return _parse(option, "proxy")
    parts = urlsplit(endpoint)
    if is_loopback_host(parts.hostname or ""):
        return ProxyRoute()
    proxies = urllib.request.getproxies_environment()
    found = proxies.get(parts.scheme)
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # no stub
    if not found or bypass(parts.hostname or "", proxies):
        return ProxyRoute()
    if "://" not in found:  # curl takes "host:port" for http://host:port
        found = f"http://{found}"
    return _parse(found, f"proxy (from the {parts.scheme.upper()}_PROXY variable)")


def _parse(value: str, key: str) -> ProxyRoute:
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise HttpSinkConfigError(f"{key}: the port is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = "a value with credentials" if "@" in value else repr(url_for_display(value))
        raise HttpSinkConfigError(f'{key}: must be "env", "none" or an http:// URL, got '
                                  f"{shown}")
    headers = {}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{port}" if port else host
    return ProxyRoute(urlunsplit((parts.scheme, netloc, parts.path, "", "")), headers)
