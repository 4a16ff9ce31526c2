"""Batches an endpoint refused for good (a permanent 4xx), kept on disk instead of lost.

One batch is two files in the sink's dead-letter directory: `<key>.ndjson` (or `.json`),
the body exactly as sent before compression, and `<key>.meta.json`, why it was refused.
The key is the batch's Idempotency-Key, so refusing the same batch twice (after a restart)
rewrites the same pair. Both are written to a temporary name, fsynced and renamed before
the sink lets its cursor pass the batch; the sidecar goes last, and only a sidecar makes
an entry, so a half-written pair is never listed. `evagg dlq replay` sends them again
(sinks/http/replay.py).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from sinks.durable import write_durably
from sinks.http.endpoint import url_for_display

if TYPE_CHECKING:
    pass

RESPONSE_LIMIT = 4096  # bytes of the refusal's response text kept in the sidecar
META_SUFFIX = ".meta.json"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: str  # the Idempotency-Key the batch was sent with
    body_path: Path
    meta_path: Path
    status: int
    response: str
    url: str  # without credentials or query
    time: str  # RFC 3339, when it was refused
    events: int
    body_format: str  # "ndjson" or "json"
    sink: str
    first_offset: int
    last_offset: int


def write_dead_letter(
    directory: Path,
    *,
    key: str,
    body: bytes | bytearray | memoryview,
    status: int,
    response: str,
    url: str,
    events: int,
    body_format: str,
    sink: str,
    first_offset: int,
    last_offset: int,
) -> DeadLetter:
    """Store one refused batch durably; raises OSError when the disk will not take it."""
    directory.mkdir(parents=True, exist_ok=True)
    letter = DeadLetter(
        key=key,
        body_path=directory / f"{key}.{body_format}",
        meta_path=directory / f"{key}{META_SUFFIX}",
        status=status,
        response=response.encode()[:RESPONSE_LIMIT].decode(errors="ignore"),
        url=url_for_display(url),
        time=dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        events=events,
        body_format=body_format,
        sink=sink,
        first_offset=first_offset,
        last_offset=last_offset,
    )
    write_durably(letter.body_path, body, sync_directory=False)
    meta = {_SIDECAR_NAMES.get(k, k): getattr(letter, k) for k in _META_FIELDS}
    write_durably(letter.meta_path, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return letter


_META_FIELDS = ("key", "status", "response", "url", "time", "events", "body_format", "sink",
                "first_offset", "last_offset")
_SIDECAR_NAMES = {"key": "idempotency_key"}


def dead_letter_dir(state_dir: Path, sink_name: str) -> Path:
    """Where the agent keeps an HTTP sink's dead letters."""
    return state_dir / "deadletter" / sink_name


class WaitingEvents:
    """The events in a dead-letter directory now (written, not yet replayed). Called at
    every /metrics scrape on the event loop: the directory is listed again only when it
    changed (a letter written, or deleted by `evagg dlq replay` in another process), and
    only the sidecars of new letters are read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seen: tuple[int, int] | None = None
        self._events: dict[str, int] = {}  # sidecar name -> its batch's events

    def events(self) -> int:
        try:
            found = self.directory.stat()
        except OSError:  # none written yet
            return 0
        stamp = (found.st_mtime_ns, found.st_ino)
        if stamp != self._seen:
            self._seen = stamp
            self._events = {name: self._events.get(name) or _sidecar_events(self.directory / name)
                            for name in _sidecars(self.directory)}
        return sum(self._events.values())


def _sidecars(directory: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(directory) if entry.name.endswith(META_SUFFIX)]
    except OSError:
        return []


def _sidecar_events(path: Path) -> int:
    letter = _read_letter(path)
    return letter.events if letter is not None else 0


def _read_letter(meta_path: Path) -> DeadLetter | None:
    """The dead letter a sidecar describes; None when it cannot be read."""
    try:
        meta = orjson.loads(meta_path.read_bytes())
        values = {k: meta[_SIDECAR_NAMES.get(k, k)] for k in _META_FIELDS}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    body_path = meta_path.parent / f"{values['key']}.{values['body_format']}"
    return DeadLetter(body_path=body_path, meta_path=meta_path, **values)


def list_dead_letters(directory: Path) -> list[DeadLetter]:
    """Every complete dead letter in `directory`, oldest first; unreadable sidecars skipped."""
    if not directory.is_dir():
        return []
    letters = [letter for meta_path in directory.glob(f"*{META_SUFFIX}")
               if (letter := _read_letter(meta_path)) is not None]
    return sorted(letters, key=lambda letter: (letter.time, letter.key))
