"""The HTTP address of an agent on demand: chosen free, proven the agent's, told to workers.

The driver that starts an agent picks its HTTP port (the default 127.0.0.1:4040 when it is
free, else one the kernel hands out), waits until the agent itself answers there, and
writes `<socket>.http` ("<host:port> <agent pid>", or " <pid>" for an agent without
HTTP), so that later drivers on the same socket learn the same address. A process that
holds a lease exports the address as OTEL_EXPORTER_OTLP_ENDPOINT (and EVAGG_AGENT_HTTP),
for itself and the workers it starts, and only an address the agent answers on: never a
port someone else holds. Standard library only.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import socket
import subprocess
import time
import tomllib
from pathlib import Path

log = logging.getLogger("evagg.autostart")
DEFAULT_LISTEN = "127.0.0.1:4040"
ENV_LISTEN = "EVAGG_HTTP_LISTEN"
ENV_ADDRESS = "EVAGG_AGENT_HTTP"  # the address this process exported, to know it is ours
ENV_OTLP = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROBE_TIMEOUT_S = 0.5

# One try to start an agent: the --http-listen value to pass (None: the agent's own
# configuration decides) and the address it should then answer on ("": no HTTP).
Attempt = tuple[str | None, str]


def address_file(socket_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(socket_path)}.http")


def attempts() -> list[Attempt]:
    """The user's address as is when they chose one; else a free port twice (a port can be
    taken between the choice and the agent's bind), then no HTTP."""
    chosen = _configured_listen()
    if chosen is not None:
        return [(None, chosen)]
    first, second = _free_listen(), _free_listen()
    return [(first, first), (second, second), ("", "")]


def _configured_listen() -> str | None:
    """EVAGG_HTTP_LISTEN, else agent.http_listen in $EVAGG_CONFIG, else None. An empty
    EVAGG_HTTP_LISTEN is unset, as the agent reads it; `http_listen = ""` in the file is off."""
    if os.environ.get(ENV_LISTEN, "").strip():
        return os.environ[ENV_LISTEN].strip()
    config = os.environ.get("EVAGG_CONFIG")
    if not config:
        return None
    try:
        with open(config, "rb") as handle:
            value = tomllib.load(handle).get("agent", {}).get("http_listen")
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return None  # the agent reports a bad config itself, in its log
    return value.strip() if isinstance(value, str) else None


def _free_listen() -> str:
    """127.0.0.1:4040 when nobody holds it now, else a port the kernel says is free."""
    for port in (int(DEFAULT_LISTEN.rpartition(":")[2]), 0):
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # as the agent binds (asyncio sets SO_REUSEADDR): a port in TIME_WAIT is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
            chosen = f"127.0.0.1:{probe.getsockname()[1]}"
            if port == 0:  # said once, where the driver sees it: workers are told it too
                log.warning("evagg: %s is taken by another program; the agent takes %s "
                            "(EVAGG_AGENT_HTTP and OTEL_EXPORTER_OTLP_ENDPOINT say so to "
                            "this process and its children)", DEFAULT_LISTEN, chosen)
            return chosen
        except OSError:
            continue
        finally:
            probe.close()
    return ""


def client_address(listen: str) -> str:
    """Where a local client reaches an agent listening on `listen` (0.0.0.0 -> 127.0.0.1)."""
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"{host}:{port}"


def agent_ready(address: str) -> bool:
    """Whether an evagg agent answers `GET /readyz` on host:port with its own word."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=PROBE_TIMEOUT_S)
    try:
        connection.request("GET", "/readyz")
        answer = connection.getresponse()
        return answer.status == 200 and answer.read(64) == b"ready\n"
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        connection.close()


def wait_ready(proc: subprocess.Popen[bytes], address: str, deadline: float) -> bool:
    """The started agent answers on `address` and is still alive (it exits when it cannot
    bind the port: then whoever answers there is not it)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if agent_ready(address):
            return proc.poll() is None
        time.sleep(0.05)
    return False


def record(socket_path: str | os.PathLike[str], address: str, pid: int) -> None:
    with contextlib.suppress(OSError):
        address_file(socket_path).write_text(f"{address} {pid}\n")


def recorded(socket_path: str | os.PathLike[str]) -> tuple[str, int] | None:
    """The address a driver recorded for the agent on this socket, if that agent lives."""
    try:
        address, _, pid_text = address_file(socket_path).read_text().strip(" \n").rpartition(" ")
        pid = int(pid_text)
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return address.strip(), pid


def export(address: str | None) -> None:
    """Tell this process and its children where the agent's HTTP is ("host:port"), or that
    it has none (""); None (not known) changes nothing.

    OTEL_EXPORTER_OTLP_ENDPOINT is set when unset or when it is the one this process set
    before; a value the user set is theirs and stays."""
    if address is None:
        return
    ours_before = os.environ.get(ENV_ADDRESS)
    current = os.environ.get(ENV_OTLP)
    mine = current is None or (bool(ours_before) and current == f"http://{ours_before}")
    if address:
        os.environ[ENV_ADDRESS] = address
        if mine:
            os.environ[ENV_OTLP] = f"http://{address}"
        return
    os.environ[ENV_ADDRESS] = ""  # known: none (emitters.otel sends over the socket then)
    if mine and current is not None:
        del os.environ[ENV_OTLP]  # never leave workers pointed at a port the agent left
