"""The spool: every accepted batch, durable on local disk until every sink has passed it.

This is the room's public face. The segment files, the log that spans them, repair at
start, the dedupe and cursor state, and the screen that sets aside records no sink can
read live in the private modules beside it; other rooms import only these names.
"""

from aggregator.spool._room_queue import SpoolFull
from aggregator.spool._screen import RecordScreen
from aggregator.spool._segment import SpoolVersionError
from aggregator.spool._spool import AppendResult, RecoveryReport, Spool, SpoolClosed
from aggregator.spool._state import SpoolLockedError

__all__ = ["AppendResult", "RecordScreen", "RecoveryReport", "Spool", "SpoolClosed",
           "SpoolFull", "SpoolLockedError", "SpoolVersionError"]
