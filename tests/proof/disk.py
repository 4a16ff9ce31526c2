"""A disk that fills under the agent: filling a filesystem, and posting events to learn
what the agent answers meanwhile (the proof suite's disk tests share these)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from sinks.disk_room import sinks_reserve
from tests.agentproc import AgentProcess
from tests.sinks.server_thread import ServerThread


def post_events(agent: AgentProcess, body: bytes) -> tuple[int, str | None]:
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), answer.headers.get("Retry-After")
    except urllib.error.HTTPError as error:
        return int(error.code), error.headers.get("Retry-After")


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def filesystem_full(path: Path) -> bool:
    """As full as the spool lets its disk be: it leaves a reserve to the sinks' files."""
    stats = os.statvfs(path)
    return free_bytes(path) < sinks_reserve(stats.f_blocks * stats.f_frsize) + 2**20


def fill(path: Path, leave: int) -> None:
    with path.open("wb") as filler:
        filler.write(bytes(free_bytes(path.parent) - leave))


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's words: `16m`) mounted at `path` (made if missing) while
    the block runs; unmounted lazily where an agent still holds it."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def agent_capped_above_its_disk(workdir: Path, receiver: ServerThread,
                                options: str = "") -> AgentProcess:
    """An agent started with its spool capped (1 GiB) far above its small disk, its one
    sink an HTTP collector at `receiver` (`options`: more of its TOML lines)."""
    sinks = f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{receiver.url}"\n{options}'
    return AgentProcess(workdir, sinks_toml=sinks, spool_toml='max_bytes = "1GiB"').start()
