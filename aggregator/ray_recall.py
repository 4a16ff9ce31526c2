"""Ray eventIds read back from the spool at start, so a resend across a restart is dropped.

Ray resends a batch until it gets a 2xx. When the agent stops (or is killed) after a
batch is spooled but before Ray has its answer, Ray sends that batch to the new agent,
whose `RecentEventIds` window starts empty: without this, every event of the batch would
be stored twice. The batch in question is among the spool's last records (the active
segment is never deleted), so the agent reads the eventIds of the newest records back,
newest first, until it has a window's worth, has read `max_bytes`, or reached the oldest.

A stored Ray row's event_id is the hex of Ray's base64 eventId, with "-<n>" when one
event gave several rows; the base64 is rebuilt from it (Ray prints standard, padded
base64, the only form the mappers accept). Rows from elsewhere are skipped by `source`.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterator
from typing import Final

import pyarrow.compute as pc

from aggregator.spool import Spool
from emitters.wire import NO_SESSION
from sinks.schema import batch_from_bytes

log = logging.getLogger(__name__)

RECALL_BYTES: Final = 256 * 2**20  # payload bytes read at most: a few seconds at start
_STEP: Final = 64  # records read per step back


def recall_ray_ids(spool: Spool, want: int, max_bytes: int = RECALL_BYTES) -> list[str]:
    """Up to about `want` eventIds of the Ray events in the spool's newest records, oldest
    first (the order to remember them in, so the newest outlive a window that fills)."""
    chunks: list[list[str]] = []
    found = read = 0
    for payload in _newest_payloads(spool):
        ids = ray_ids_of(payload)
        chunks.append(ids)
        found += len(ids)
        read += len(payload)
        if found >= want or read >= max_bytes:
            break
    return [event_id for ids in reversed(chunks) for event_id in ids]


def _newest_payloads(spool: Spool) -> Iterator[bytes]:
    """The payloads of session-less records (HTTP routes, Ray among them), newest first."""
    end = spool.next_offset
    first = spool.first_offset
    while end > first:
        start = max(first, end - _STEP)
        records = []
        at = start
        while at < end:
            batch = [r for r in spool.read(at, max_records=end - at) if r.offset < end]
            if not batch:
                break
            records += batch
            at = batch[-1].offset + 1
        for record in reversed(records):
            if record.session == NO_SESSION:
                yield record.payload
        end = start


def ray_ids_of(payload: bytes) -> list[str]:
    """Ray's eventIds (base64) of the rows one spool record holds from Ray, each once."""
    batch = batch_from_bytes(payload)
    from_ray = pc.equal(batch.column("source"), "ray")
    hex_ids = pc.filter(batch.column("event_id"), from_ray).to_pylist()
    out: dict[str, None] = {}
    for hex_id in hex_ids:
        event_id = _base64_of(hex_id.partition("-")[0]) if hex_id else None
        if event_id is not None:
            out[event_id] = None
    return list(out)


def _base64_of(hex_id: str) -> str | None:
    try:
        return base64.b64encode(bytes.fromhex(hex_id)).decode("ascii")
    except (ValueError, binascii.Error):
        return None  # not one of Ray's ids (a content digest, a producer's own id)
