"""Ray's log files read back from the lake's `_logs/` pieces (sinks/raylogs/layout.py).

A file's bytes are its pieces joined by offset: a byte is taken from the first piece
that holds it, so pieces written twice over each other (after an agent lost its state)
repeat nothing, and a gap ends what can be read. Works on a local directory and on an
s3:// prefix, as the dashboard's store does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboard.lake.s3 import S3Settings
from dashboard.lake.store import StoreOptions
from sinks.locations import S3Location, is_s3_url
from sinks.raylogs.layout import (
    LOGS_ROOT,
    LogFile,
    decompress_piece,
    key_part,
    parse_prefix,
    piece_range,
)


@dataclass(frozen=True, slots=True)
class StoredPiece:
    start: int
    end: int
    where: str  # a local path or an object key


class LogArchive:
    def __init__(self, options: StoreOptions) -> None:
        self._s3: S3Location | None = None
        self._client: Any = None
        if is_s3_url(options.location):
            import boto3

            self._s3 = S3Location.parse(options.location)
            self._client = S3Settings.resolve(options.endpoint_url, options.region,
                                              boto3.Session()).client()
        else:
            self._root = Path(options.location).expanduser()

    # -- what is there ---------------------------------------------------------------

    def files(self, session: str, node: str | None = None) -> dict[LogFile, list[StoredPiece]]:
        """Every stored generation of every file of a session (on one node), with its pieces."""
        prefix = f"{LOGS_ROOT}/session={key_part(session)}/"
        if node is not None:
            prefix += f"node={key_part(node)}/"
        found: dict[LogFile, list[StoredPiece]] = {}
        for relative, where in self._walk(prefix):
            parts = relative.split("/")
            log_file = parse_prefix(parts[1:-1]) if len(parts) == 6 else None
            span = piece_range(parts[-1])
            if log_file is not None and span is not None:
                found.setdefault(log_file, []).append(StoredPiece(*span, where))
        for pieces in found.values():
            pieces.sort(key=lambda p: (p.start, -p.end))
        return found

    def sessions(self) -> list[str]:
        names = {relative.split("/")[1] for relative, _ in self._walk(f"{LOGS_ROOT}/")}
        return sorted(name.removeprefix("session=") for name in names
                      if name.startswith("session="))

    # -- reading ---------------------------------------------------------------------

    def read(self, pieces: list[StoredPiece], start: int = 0, end: int | None = None) -> bytes:
        """The bytes [start, end) of one generation (end None: all that is stored)."""
        out = bytearray()
        at = start
        for piece in pieces:
            if end is not None and at >= end:
                break
            if piece.end <= at:
                continue
            if piece.start > at:
                break  # a gap: nothing after it can be placed
            body = self._body(piece)
            stop = len(body) if end is None else min(len(body), end - piece.start)
            out += body[at - piece.start:stop]
            at = piece.start + stop
        return bytes(out)

    @staticmethod
    def length(pieces: list[StoredPiece]) -> int:
        """How many bytes from 0 are stored without a gap."""
        at = 0
        for piece in pieces:
            if piece.start > at:
                break
            at = max(at, piece.end)
        return at

    def _body(self, piece: StoredPiece) -> bytes:
        size = piece.end - piece.start
        if self._s3 is None:
            return decompress_piece(Path(piece.where).read_bytes(), size)
        answer = self._client.get_object(Bucket=self._s3.bucket, Key=piece.where)
        return decompress_piece(answer["Body"].read(), size)

    def _walk(self, prefix: str) -> Iterator[tuple[str, str]]:
        """(key relative to the lake, where to read it) of everything under `prefix`."""
        if self._s3 is None:
            top = self._root / prefix
            for directory, _, names in os.walk(top):
                for name in names:
                    full = os.path.join(directory, name)
                    yield os.path.relpath(full, self._root).replace(os.sep, "/"), full
            return
        paginator = self._client.get_paginator("list_objects_v2")
        base = self._s3.prefix
        for page in paginator.paginate(Bucket=self._s3.bucket, Prefix=base + prefix):
            for item in page.get("Contents", ()):
                yield item["Key"][len(base):], item["Key"]

