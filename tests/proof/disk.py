"""A disk that fills under the agent: filling a filesystem, and posting events to learn
what the agent answers meanwhile (the proof suite's disk tests share these)."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from tests.agentproc import AgentProcess


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
    return free_bytes(path) < 2**20


def fill(path: Path, leave: int) -> None:
    with path.open("wb") as filler:
        filler.write(bytes(free_bytes(path.parent) - leave))
