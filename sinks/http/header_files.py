"""Header values from files (`file:/path`), read again when a file changes.

Tokens are rotated by writing a new file (a Kubernetes Secret's volume swaps a symlink,
a vault agent renames a new file into place): the sink looks at each header file before
every request, a stat, and reads it again when its inode, size or modification time
changed, so the next request carries the new value without a reload. A file that is
gone (deleted, moved away), cannot be read, or reads empty (a writer between truncating
and writing) keeps the value read before: a token still valid goes on working, and one
revoked is refused (401, `http_auth`), which says so. Meanwhile the sink warns once per
problem and counts the header (`unusable`: `evagg status`, the `header_files_unusable`
gauge); it is looked at again before every request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping

from sinks.http.options import read_header_file

log = logging.getLogger("evagg.sinks.http")
Stamp = tuple[int, int, int, int]


def _stamp(path: str) -> Stamp:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class HeaderFiles:
    """The `file:` headers of one sink (header name -> path) and what their files were
    like when last read."""

    def __init__(self, sink: str, files: Mapping[str, str]) -> None:
        self.sink = sink
        self.files = dict(files)
        # nothing stamped yet: the first request reads each file again, so a change
        # between the options' read and now is not missed
        self._stamps: dict[str, Stamp | None] = {}
        self._said: set[tuple[str, str]] = set()  # (header, problem) already logged
        # headers whose file is gone, unreadable or empty now: the value before is sent
        self.unusable: set[str] = set()

    def refresh(self, headers: MutableMapping[str, str]) -> bool:
        """Read again each file that changed since its last read into `headers`; True
        when a value is now different. Never raises and logs no value."""
        changed = False
        for name, path in self.files.items():
            try:
                stamp = _stamp(path)
            except OSError as exc:
                self._unusable(name, f"file {path}: {exc.strerror or exc} (deleted or moved?)")
                continue
            if stamp == self._stamps.get(name):
                continue
            try:
                value = read_header_file(name, path)
            except ValueError as exc:
                self._unusable(name, str(exc))
                continue
            if not value:
                self._unusable(name, f"file {path} is empty")
                continue
            self._stamps[name] = stamp
            self._usable_again(name, path)
            if value != headers.get(name):
                headers[name] = value
                changed = True
                log.info("sink %s: header %s read again from %s: the file changed",
                         self.sink, name, path)
        return changed

    def _unusable(self, name: str, problem: str) -> None:
        self.unusable.add(name)
        if (name, problem) not in self._said:
            self._said.add((name, problem))
            log.warning("sink %s: header %s: %s; the value read before is still sent. "
                        "Write the file again: the sink reads it before its next request",
                        self.sink, name, problem)

    def _usable_again(self, name: str, path: str) -> None:
        if name in self.unusable:
            self.unusable.discard(name)
            log.info("sink %s: header %s: %s can be read again", self.sink, name, path)
        self._said = {said for said in self._said if said[0] != name}
