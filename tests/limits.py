"""Running a peer under a lower file-descriptor limit, as a hostile-client test needs: a
node's usual 1024, scaled down so that a test can reach it with a few hundred sockets."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DESCRIPTOR_LIMIT = 400
# prlimit's job, where util-linux is not installed: the limit is set, then the command
# replaces this process.
_LOWER_DESCRIPTOR_LIMIT = (
    "import os, resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({DESCRIPTOR_LIMIT}, {DESCRIPTOR_LIMIT})); "
    "os.execv(sys.argv[1], sys.argv[1:])")


def with_fewer_descriptors() -> list[str]:
    """The prefix that runs a command with at most DESCRIPTOR_LIMIT file descriptors."""
    return [sys.executable, "-c", _LOWER_DESCRIPTOR_LIMIT]


def descriptor_limits(pid: int) -> str:
    """The process's "Max open files" line (soft and hard limits)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return line
    return ""


def runs_with_fewer_descriptors(pid: int) -> bool:
    return descriptor_limits(pid).split()[3:5] == [str(DESCRIPTOR_LIMIT)] * 2


@contextlib.contextmanager
def held_connections(port: int, count: int = 600) -> Iterator[int]:
    """Up to `count` loopback connections to `port` that send nothing, held open until the
    block ends (more than a peer under DESCRIPTOR_LIMIT can take: opening stops at the
    first refusal); yields how many were opened, once the peer has accepted what it can."""
    holders: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                holders.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                break
        time.sleep(0.5)  # the peer accepts what it can
        yield len(holders)
    finally:
        for held in holders:
            held.close()
