"""Where the agent listens and keeps its state when nothing says otherwise.

A system agent (systemd, DaemonSet) listens on /run/evagg/events.sock. A user's agent,
started with no configuration, listens under the user's runtime directory, so that
`evagg run` works without root. Producers look at EVAGG_SOCKET first, then the system
socket if it exists, then the user's.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_SOCKET = Path("/run/evagg/events.sock")


def user_runtime_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "evagg"
    return Path("/tmp") / f"evagg-{os.getuid()}"


def user_socket_path() -> Path:
    return user_runtime_dir() / "events.sock"


def default_socket_path() -> Path:
    """The socket a producer connects to."""
    configured = os.environ.get("EVAGG_SOCKET")
    if configured:
        return Path(configured)
    if SYSTEM_SOCKET.exists():
        return SYSTEM_SOCKET
    return user_socket_path()


def user_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "evagg"


def user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "evagg" / "parquet"
