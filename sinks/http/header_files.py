"""Header values from files (`file:/path`), read again when a file changes.

Tokens are rotated by writing a new file (a Kubernetes Secret's volume swaps a symlink,
a vault agent renames a new file into place): the sink looks at each header file before
every request, a stat, and reads it again when its inode, size or modification time
changed, so the next request carries the new value without a reload. A file that cannot
be read, or reads empty (a writer between truncating and writing), keeps the value read
before, and is looked at again on the next request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping

from sinks.http.options import read_header_file

log = logging.getLogger("evagg.sinks.http")
Stamp = tuple[int, int, int, int]


def _stamp(path: str) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
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

    def refresh(self, headers: MutableMapping[str, str]) -> bool:
        """Read again each file that changed since its last read into `headers`; True
        when a value is now different. Never raises and logs no value."""
        changed = False
        for name, path in self.files.items():
            stamp = _stamp(path)
            if stamp is None or stamp == self._stamps.get(name):
                continue
            try:
                value = read_header_file(name, path)
            except ValueError as exc:
                self._say(name, f"{exc}; the value read before is sent meanwhile")
                continue
            if not value:
                self._say(name, f"file {path} is empty; the value read before is sent "
                          "meanwhile")
                continue
            self._stamps[name] = stamp
            if value != headers.get(name):
                headers[name] = value
                changed = True
                self._said = {said for said in self._said if said[0] != name}
                log.info("sink %s: header %s read again from %s: the file changed",
                         self.sink, name, path)
        return changed

    def _say(self, name: str, problem: str) -> None:
        if (name, problem) not in self._said:
            self._said.add((name, problem))
            log.warning("sink %s: header %s: %s", self.sink, name, problem)
