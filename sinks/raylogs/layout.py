"""Where a piece of a Ray log file lives in the lake, shared by the agent and the readers.

```
<lake>/_logs/session=<ray session>/node=<ray node id>/<file name>/gen=<g>/<start>-<end>.zst
```

The `_logs` root starts with `_`, so no `**/*.parquet` glob, Hive listing or `evagg
compact` walk reads it as events, and its files are zstd frames, not Parquet. A piece holds the
bytes [start, end) of one generation of one file: the generation counts the times the
file was rotated away or truncated under its name. A piece is named by nothing but
that, so a piece sent again after a kill or a failed upload is the same object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

LOGS_ROOT: Final = "_logs"
PIECE_SUFFIX: Final = ".zst"
_PIECE_NAME: Final = re.compile(r"^(\d{20})-(\d{20})\.zst$")
_GENERATION: Final = re.compile(r"^gen=(\d{4,})$")


@dataclass(frozen=True, slots=True, order=True)
class LogFile:
    """One generation of one of Ray's log files on one node of one session."""

    session: str
    node: str  # Ray's node id in hex
    name: str  # the file name in the session's logs directory, e.g. worker-...-123.out
    generation: int = 0

    def prefix(self) -> str:
        """The directory (key prefix) of this generation's pieces, ending in "/"."""
        return (f"{LOGS_ROOT}/session={key_part(self.session)}/node={key_part(self.node)}/"
                f"{key_part(self.name)}/gen={self.generation:04d}/")


def piece_key(log_file: LogFile, start: int, end: int) -> str:
    return f"{log_file.prefix()}{start:020d}-{end:020d}{PIECE_SUFFIX}"


def piece_range(name: str) -> tuple[int, int] | None:
    """(start, end) of a piece's file name; None for any other name (staging files)."""
    found = _PIECE_NAME.match(name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def parse_prefix(parts: list[str]) -> LogFile | None:
    """The LogFile of the four key parts after `_logs/` (session=, node=, name, gen=)."""
    if len(parts) != 4 or not parts[0].startswith("session=") or not parts[1].startswith("node="):
        return None
    generation = _GENERATION.match(parts[3])
    if generation is None:
        return None
    return LogFile(unquote(parts[0][8:]), unquote(parts[1][5:]), unquote(parts[2]),
                   int(generation.group(1)))


def compress_piece(data: bytes) -> bytes:
    """The object's body: one zstd frame (level 1, about 3.5 times gzip's speed on
    training output), the same bytes always the same object; `zstd -dc` reads it, and
    pieces joined in name order (`cat *.zst | zstd -dc`) give the file."""
    import pyarrow as pa  # here: `evagg query` reads this module's layout, not its pieces

    return bytes(pa.compress(data, codec="zstd", asbytes=True))


def decompress_piece(body: bytes, size: int) -> bytes:
    """`size` is the piece's end minus its start, from its name."""
    if not size:
        return b""
    import pyarrow as pa

    return bytes(pa.decompress(body, decompressed_size=size, codec="zstd", asbytes=True))


def key_part(value: str) -> str:
    """Escaped so that no value can add a key level or climb out of one."""
    text = quote(value, safe="-_.")
    if text in (".", ".."):
        return text.replace(".", "%2E")
    return text or "_"
