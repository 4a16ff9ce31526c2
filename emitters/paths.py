"""Where the agent listens and keeps its state when nothing says otherwise.

A system agent (systemd, DaemonSet) listens on /run/evagg/events.sock. A user's agent,
started with no configuration, listens under the user's runtime directory, so that
`evagg run` works without root. Producers look at EVAGG_SOCKET first, then the system
socket if it exists, then the user's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SYSTEM_SOCKET = Path("/run/evagg/events.sock")


def user_runtime_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "evagg"
    return shared_tmp_dir()


def shared_tmp_dir() -> Path:
    """The user's folder when there is no runtime directory. Its name is known to every
    user of the machine, and any of them may create it first: it is used only once
    `unsafe_directory` finds nothing wrong with it."""
    return Path("/tmp") / f"evagg-{os.getuid()}"


def unsafe_directory(directory: Path) -> str:
    """Why another local user could replace what this user keeps in `directory` (a
    socket, the lock and address files beside it), or "" when nobody can: it (and a
    symlink to it) belongs to this user or root, and nobody else may write in it unless
    it is sticky, as /tmp is (where others cannot remove or rename our files). A
    directory that does not exist is "": whoever creates it checks it again."""
    owners = (os.getuid(), 0)
    try:
        link = os.lstat(directory)
        info = os.stat(directory)
    except FileNotFoundError:
        return ""
    for what, found in (("symlink", link), ("directory", info)):
        if found.st_uid not in owners:
            return (f"the {what} {directory} belongs to uid {found.st_uid}, another user, "
                    "who could replace the socket and the files in it")
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return (f"{directory} may be written by every user (mode "
                f"{stat.S_IMODE(info.st_mode):04o}), who could replace the socket in it")
    return ""


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
