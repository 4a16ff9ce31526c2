"""Spool records that no sink can read: a payload whose checksum holds but that is not an
Arrow batch of EVENT_SCHEMA (written behind the agent's back, or left by a bug).

Each sink's consumer screens what it reads (an Arrow IPC parse of the batch's metadata
and a check of its buffers' sizes). A record that fails is copied into the spool's
quarantine directory, as damaged segments are (and pruned with them); its events are
counted once as lost by the policy "undecodable_record" in the agent's `LossRecorder`
(`evagg_dropped_events_total` and a `loss` event); and every sink gets an empty record at
its offset instead. Without this, each sink failed on that record for good, and the
spool filled behind it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from typing import Final

from aggregator.losses import LossRecorder
from aggregator.spool._spool import Spool
from aggregator.spool._state import QUARANTINE_DIR
from sinks.records import SpoolRecord
from sinks.schema import batch_from_bytes, batch_to_bytes, empty_batch

log = logging.getLogger("evagg.spool")
LOSS_REASON: Final = "undecodable_record"


@functools.cache
def empty_payload() -> bytes:
    """A record of no events, for the offset of one set aside (made when first needed)."""
    return batch_to_bytes(empty_batch())


class RecordScreen:
    """One per spool, shared by its consumers, so a bad record is counted once."""

    def __init__(self, spool: Spool, losses: LossRecorder | None = None) -> None:
        self.spool = spool
        self.losses = losses or spool.losses  # the agent gives the spool its one recorder
        self._quarantined: set[int] = set()  # offsets this process has handled

    def screen(self, records: Sequence[SpoolRecord]) -> list[SpoolRecord]:
        """`records`, each unreadable one replaced by an empty record at its offset."""
        return [record if _readable(record) else self._set_aside(record) for record in records]

    def _set_aside(self, record: SpoolRecord) -> SpoolRecord:
        if record.offset not in self._quarantined:
            self._quarantined.add(record.offset)
            self._keep(record)
        return dataclasses.replace(record, count=0, payload=empty_payload())

    def _keep(self, record: SpoolRecord) -> None:
        """Copy the bytes aside and count the loss, unless an earlier run did both."""
        directory = self.spool.directory / QUARANTINE_DIR
        stem = f"record-{record.offset:020d}"
        if any(directory.glob(f"{stem}.*.corrupt")):
            return
        kept = directory / f"{stem}.{time.time_ns()}.corrupt"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(record.payload)
        except OSError as exc:  # the loss still counts; only the copy is missing
            log.warning("spool: cannot keep unreadable record %d: %s", record.offset, exc)
            kept = directory / "(not kept)"
        self.losses.record(LOSS_REASON, record.count)
        log.error("spool: record %d (%d events, %d bytes) is not an event batch any sink can "
                  "read; skipped and counted as lost, its bytes kept in %s", record.offset,
                  record.count, record.size, kept)


def _readable(record: SpoolRecord) -> bool:
    try:
        batch_from_bytes(record.payload).validate()
    except Exception:  # any parse or validation error: the sinks could not read it either
        return False
    return True
