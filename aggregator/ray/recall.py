"""Ray eventIds read back from the spool at start, so a resend across a restart is dropped.

Ray resends a batch until it gets a 2xx. When the agent stops (or is killed) after a
batch is spooled but before Ray has its answer, Ray sends that batch to the new agent,
whose `RecentEventIds` window starts empty: without this, every event of the batch would
be stored twice. The batch in question is among the spool's last records (the active
segment is never deleted), so the agent reads the newest records back one at a time,
newest first, until it has a window's worth of ids, has read `max_bytes` (or
`max_records`) of records of any route, or reached the oldest. A record that cannot be
read is skipped and counted.

A stored Ray row's event_id is the hex of Ray's base64 eventId, with "-<n>" when one
event gave several rows; the base64 is rebuilt from it (Ray prints standard, padded
base64, the only form the mappers accept). An eventId in another form was stored under a
digest and kept as sent in attrs["ray_event_id"], which is used instead. Rows from
elsewhere are skipped by `source`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import pyarrow.compute as pc

from aggregator.spool import Spool
from emitters.wire import NO_SESSION
from sinks.schema import batch_from_bytes

RECALL_BYTES: Final = 64 * 2**20  # records read at most, of any route: well under a second
RECALL_RECORDS: Final = 10_000  # and at most this many (each is one read)


@dataclass
class Recalled:
    ids: list[str] = field(default_factory=list)  # oldest first: the order to remember them
    unreadable: int = 0  # records whose payload could not be decoded (skipped)


def recall_ray_ids(spool: Spool, want: int, max_bytes: int = RECALL_BYTES,
                   max_records: int = RECALL_RECORDS) -> Recalled:
    """About `want` eventIds of the Ray events in the spool's newest records (fewer when
    `max_bytes` or `max_records` of records were read first)."""
    chunks: list[list[str]] = []
    found = 0
    unreadable = 0
    for payload in _newest_payloads(spool, max_bytes, max_records):
        try:
            ids = ray_ids_of(payload)
        except Exception:  # damaged, or of another schema: the rest still counts
            unreadable += 1
            continue
        chunks.append(ids)
        found += len(ids)
        if found >= want:
            break
    return Recalled([event_id for ids in reversed(chunks) for event_id in ids], unreadable)


def _newest_payloads(spool: Spool, max_bytes: int, max_records: int) -> Iterator[bytes]:
    """The payloads of session-less records (HTTP routes, Ray among them), newest first;
    one record in memory at a time, every record read counted against the limits."""
    read = 0
    last = spool.next_offset - 1
    first = max(spool.first_offset, last - max_records + 1)
    for offset in range(last, first - 1, -1):
        records = spool.read(offset, max_bytes=1, max_records=1)
        if not records or records[0].offset != offset:
            continue  # dropped by policy: a gap in the offsets
        record = records[0]
        if record.session == NO_SESSION:
            yield record.payload
        read += record.size
        if read >= max_bytes:
            return


def ray_ids_of(payload: bytes) -> list[str]:
    """Ray's eventIds of the rows one spool record holds from Ray, each once."""
    batch = batch_from_bytes(payload)
    from_ray = pc.equal(batch.column("source"), "ray")
    hex_ids = pc.filter(batch.column("event_id"), from_ray).to_pylist()
    as_sent = pc.filter(pc.map_lookup(batch.column("attrs"), "ray_event_id", "first"),
                        from_ray).to_pylist()
    out: dict[str, None] = {}
    for hex_id, sent in zip(hex_ids, as_sent, strict=True):
        event_id = sent or (_base64_of(hex_id.partition("-")[0]) if hex_id else None)
        if event_id is not None:
            out[event_id] = None
    return list(out)


def _base64_of(hex_id: str) -> str | None:
    try:
        return base64.b64encode(bytes.fromhex(hex_id)).decode("ascii")
    except (ValueError, binascii.Error):
        return None  # not one of Ray's ids (a content digest, a producer's own id)
