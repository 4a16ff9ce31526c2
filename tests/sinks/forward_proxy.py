"""A real forward proxy on 127.0.0.1, as a cluster's egress proxy is: `CONNECT host:port`
opens a tunnel (how clients reach https:// through a proxy) and an absolute-form request
(`POST http://host:port/path`) is passed on in origin form (how they reach http://).
It keeps the targets it was asked for, so a test sees which requests went through it (the
first request of each connection: later ones on a kept-alive connection pass as they are).
`hosts` resolves names for it alone (the test's endpoints stay on 127.0.0.1), and with
`credentials` set it answers 407 to a request that does not carry them."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class ForwardProxy:
    targets: list[str] = field(default_factory=list)  # "CONNECT host:port" / "POST url"
    credentials: list[str] = field(default_factory=list)  # Proxy-Authorization values
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address, for this proxy
    required: str | None = None  # the Proxy-Authorization value it insists on
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, version = head.split(b"\r\n", 1)[0].decode().split(" ")
            self.targets.append(f"{method} {target}")
            given = None
            for line in head.decode().split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "proxy-authorization":
                    given = value.strip()
                    self.credentials.append(given)
            if self.required is not None and given != self.required:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Proxy-Authenticate: Basic\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
                await writer.drain()
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                upstream = await asyncio.open_connection(self.hosts.get(host, host), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # absolute form: this connection goes to that one origin
                parts = urlsplit(target)
                host = parts.hostname or ""
                upstream = await asyncio.open_connection(self.hosts.get(host, host),
                                                         parts.port or 80)
                origin_form = f"{method} {parts.path or '/'} {version}".encode()
                upstream[1].write(origin_form + b"\r\n" + _end_to_end(head))
            await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def _end_to_end(head: bytes) -> bytes:
    """The request's headers less the ones meant for the proxy (as a real proxy does)."""
    lines = head.split(b"\r\n")[1:]
    return b"\r\n".join(line for line in lines
                         if not line.lower().startswith(b"proxy-"))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.close()
