"""What the spool counts about its own work since it opened (`Spool.counters`).

Exported as `evagg_spool_totals{total}` (docs/metrics.md, docs/spool.md). Losses are
not here: they are events lost, counted by the agent's one `LossRecorder`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class SpoolCounters:
    appended_records: int = 0
    appended_events: int = 0
    duplicates: int = 0  # resent frames already stored
    truncated_bytes: int = 0  # torn bytes cut at recovery
    corrupt_records: int = 0  # records dropped at recovery
    segments_deleted: int = 0
    fsyncs: int = 0  # of segment files
    fsync_errors: int = 0
    full_waits: int = 0  # appends that waited for room (when_full = "block")
    dropped_records: int = 0  # records dropped for room (when_full = "drop_oldest")
    enospc_commits: int = 0  # cursor commits on a full disk

    def items(self) -> list[tuple[str, int]]:
        """(name, count) in a fixed order, for /metrics."""
        return [(field.name, getattr(self, field.name)) for field in dataclasses.fields(self)]
