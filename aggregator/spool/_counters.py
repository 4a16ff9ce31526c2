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
    # failed background unlinks of collected segments, by reason (an errno name); retried
    unlink_errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def count_unlink_error(self, reason: str) -> None:
        self.unlink_errors[reason] = self.unlink_errors.get(reason, 0) + 1

    def items(self) -> list[tuple[str, int]]:
        """(name, count) in a fixed order, for /metrics; `unlink_errors` as its total, then
        one `unlink_errors_<reason>` per reason seen."""
        out: list[tuple[str, int]] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, dict):
                out.append((field.name, sum(value.values())))
                out += [(f"{field.name}_{reason}", n) for reason, n in sorted(value.items())]
            else:
                out.append((field.name, value))
        return out
