"""The two systemd protocols the agent speaks itself: sd_notify and socket activation.

No libsystemd: both are a few lines over the standard library, and a no-op outside systemd.
"""

from __future__ import annotations

import functools
import os
import socket

SD_LISTEN_FDS_START = 3


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") to NOTIFY_SOCKET; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode())
        except OSError:
            return False
    return True


@functools.cache
def inherited_socket() -> socket.socket | None:
    """The listening Unix socket passed by systemd (LISTEN_FDS), if this process got one."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    sock.setblocking(False)
    for variable in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(variable, None)  # not for our children
    return sock
