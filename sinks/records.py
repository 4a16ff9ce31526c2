"""The unit the spool stores and hands to sinks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One accepted batch of events, as written to the spool.

    `offset` numbers records across all segments, starting at 1, without gaps except
    where records were dropped by policy. `payload` is an Arrow IPC record-batch
    message of `sinks.schema.EVENT_SCHEMA` (read it with `sinks.schema.batch_from_bytes`).
    """

    offset: int
    session: bytes  # 16 bytes; all zero for batches that came without a session (HTTP)
    seq: int
    received_ns: int
    count: int  # events in the payload
    payload: bytes

    @property
    def size(self) -> int:
        return len(self.payload)
