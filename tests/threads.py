"""A process's threads as the operating system names them (Linux's /proc)."""

from __future__ import annotations

from pathlib import Path


def thread_names(pid: int) -> list[str]:
    """The threads' names as `top -H` and `ps -L` show them."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return names
