"""What the follower knows of each file, kept on disk so a restart resumes exactly.

Before a piece is uploaded its range is written down here (the file's `intent`); after a
kill the agent uploads that same range again before anything new, so the object it
writes has the same key and the same bytes: every byte once, through kills.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from sinks.durable import write_durably
from sinks.raylogs.layout import LogFile

log = logging.getLogger("evagg.raylogs")


@dataclass(slots=True)
class Followed:
    """One file Ray named, and how far its current generation is shipped."""

    session: str
    node: str
    path: str
    named_at: float  # wall clock seconds when the first event named it
    generation: int = 0
    inode: int | None = None  # of the generation being read; None until first seen
    offset: int = 0  # bytes of this generation in the lake
    seen_size: int = 0  # the largest size seen of this generation
    intent_end: int | None = None  # a piece [offset, intent_end) being uploaded
    rotated_from: str | None = None  # where the old generation is read from after rotation
    done: bool = False  # gone, refused or lost: never looked at again

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def log_file(self) -> LogFile:
        return LogFile(self.session, self.node or "_", self.name, self.generation)


class FollowState:
    """Every followed file by path, saved as one JSON file under the state directory."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "follow.json"
        self.files: dict[str, Followed] = {}
        self.dirty = False

    def load(self) -> None:
        try:
            raw = orjson.loads(self.path.read_bytes())
            self.files = {entry["path"]: Followed(**entry) for entry in raw}
        except FileNotFoundError:
            self.files = {}
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            # Nothing better to resume from: start over. Readers take each byte by its
            # offset, so pieces shipped again over old ones repeat no byte.
            log.warning("Ray log follow state %s unreadable (%s): starting over", self.path, exc)
            self.files = {}

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, orjson.dumps([asdict(f) for f in self.files.values()]))
        self.dirty = False
