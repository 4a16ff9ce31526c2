"""What the shipper has shipped, by file path, kept in the state directory across restarts.

A record is written down before its object is published (`indexed` false) and marked
indexed once its `artifact` event is spooled. After a kill, a file whose content is
still the recorded one is published again under the same version, so the object has the
same key and bytes and the event the same id; any other content is the next version.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from sinks.durable import write_durably

log = logging.getLogger("evagg.artifacts")


@dataclass(slots=True)
class Shipped:
    """The last content shipped from one path."""

    path: str
    size: int
    mtime_ns: int
    sha256: str
    version: int
    indexed: bool = False  # its artifact event is in the spool


class ShippedState:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "shipped.json"
        self.files: dict[str, Shipped] = {}

    def load(self) -> None:
        try:
            raw = orjson.loads(self.path.read_bytes())
            self.files = {entry["path"]: Shipped(**entry) for entry in raw}
        except FileNotFoundError:
            self.files = {}
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            # Without it every file would ship again as version 1 over the old objects:
            # refuse to guess and stop shipping until someone looks.
            raise RuntimeError(f"artifact state {self.path} is unreadable ({exc}); move it "
                               "away to ship every watched file again as new") from exc

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, orjson.dumps([asdict(f) for f in self.files.values()]))
