"""A body the endpoint refused as too large (HTTP 413), in halves: the HTTP sink sends a
batch again in halves, and `evagg dlq replay` a dead letter, by this one rule."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import orjson

from sinks.http.batches import Batch, Body, BodyFormat, frame_body


@dataclass(frozen=True, slots=True)
class Half:
    key: str
    events: int
    body: Body


def halves_of(key: str, body: Body, body_format: BodyFormat) -> list[Half]:
    """A body the endpoint refused as too large (413) as two halves by events, each under
    a key of its own derived from `key` (the same halves, and keys, on every resend): the
    sink's batches and `evagg dlq replay`'s dead letters are split alike. A body of one
    event cannot be split: []."""
    whole = bytes(body)
    if body_format == "ndjson":
        rows = [line + b"\n" for line in whole.split(b"\n") if line]
    else:  # the array's separators were the rows' newlines: find the rows by parsing
        rows = [orjson.dumps(value) + b"\n" for value in orjson.loads(whole)]
    if len(rows) < 2:
        return []
    middle = len(rows) // 2
    return [Half(hashlib.sha256(f"{key}\n{start}\n{stop}".encode()).hexdigest()[:32],
                 stop - start, frame_body([b"".join(rows[start:stop])], body_format))
            for start, stop in ((0, middle), (middle, len(rows)))]


def split_batch(batch: Batch, body_format: BodyFormat) -> list[Batch]:
    """A batch refused as too large (413) as two batches (halves_of). []: one event."""
    if batch.events < 2:
        return []
    return [replace(batch, key=half.key, events=half.events, resend=False,
                    acknowledged=False, body=half.body)
            for half in halves_of(batch.key, batch.body, body_format)]
