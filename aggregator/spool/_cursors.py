"""Each sink's committed cursor: the next offset it needs, kept on disk, and the floor
below which every sink that holds segments has passed (so those segments may go)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from aggregator.spool._state import read_cursors, write_cursor


class Cursors:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._positions: dict[str, int] = {}
        self._registered: set[str] | None = None  # None: every known cursor holds segments

    def load(self) -> list[str]:
        """Read the committed cursors; returns the names of files that could not be read."""
        self._positions, bad = read_cursors(self.directory)
        return bad

    def highest(self) -> int:
        return max(self._positions.values(), default=0)

    def position(self, sink: str, first_offset: int) -> int:
        """The next offset `sink` needs; a new sink starts at the oldest record present."""
        return max(self._positions.setdefault(sink, first_offset), first_offset)

    def committed(self, sink: str) -> int:
        return self._positions.get(sink, 0)

    def save(self, sink: str, next_offset: int) -> None:
        """Write the cursor to disk, then remember it (a failed write leaves it as it was)."""
        write_cursor(self.directory, sink, next_offset)
        self._positions[sink] = next_offset

    def move_without_saving(self, sink: str, next_offset: int) -> None:
        """For a full disk: the segments below must go before the cursor can be written."""
        self._positions[sink] = next_offset

    def register(self, names: Iterable[str], first_offset: int) -> None:
        """The configured sinks: from now on only their cursors hold segments back."""
        self._registered = set(names)
        for name in self._registered:
            self._positions.setdefault(name, first_offset)

    def behind(self, offset: int) -> list[str]:
        """The sinks holding segments whose cursor is below `offset` (what a drop below it
        takes from them)."""
        names = self._positions.keys() if self._registered is None else self._registered
        return sorted(n for n in names if self._positions.get(n, 0) < offset)

    def raise_to(self, first_offset: int) -> None:
        """After the oldest segments were dropped: no cursor points below what is left."""
        for sink, position in self._positions.items():
            self._positions[sink] = max(position, first_offset)

    def floor(self, first_offset: int) -> int | None:
        """The lowest cursor among the sinks that hold segments; None when there are none."""
        names = self._positions.keys() if self._registered is None else self._registered
        return min((max(self._positions.get(n, first_offset), first_offset) for n in names),
                   default=None)
