"""A free TCP port on the loopback address, for a peer a test starts (an agent's HTTP
port, moto, an HTTP endpoint, Ray's dashboard)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick); the caller binds it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
