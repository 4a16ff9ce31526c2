"""The agents that drivers started on demand (emitters.autostart), found by the command
line they run with, so a test can count them and kill what it started."""

from __future__ import annotations

from pathlib import Path

from emitters.autostart import users_lock_path


def agent_pids(socket_path: Path) -> list[int]:
    """Live processes started as agents on demand for this socket (zombies excluded)."""
    marker = str(users_lock_path(socket_path)).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"--exit-when-unused" in args and marker in args and state != "Z":
            found.append(int(entry.name))
    return found
