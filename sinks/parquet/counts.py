"""What the Parquet sink counts about itself, handed to the agent through `Sink.counters()`.

Exported on /metrics as `evagg_sink_<name>_total{sink, type="parquet"[, reason]}`; the
names and reasons are listed in docs/metrics.md. A failure is counted by the phase it
happened in, so that an operator can tell a lake that refuses uploads (`publish`) from a
local disk that cannot stage a file (`write`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from sinks.base import SinkCounter

# what each of the sink's own counts and values measures (Sink.metric_help; its S3
# store's and its hour merge's are beside their counts)
METRIC_HELP: Final[Mapping[str, str]] = {
    "files_written": "Parquet files published under their final key (on S3: uploaded)",
    "bytes_written": "Bytes of the Parquet files published",
    "events_written": "Rows in the Parquet files published",
    "write_failures": "Parquet files that could not be built, by reason",
    "publish_failures": "Finished Parquet files that could not be uploaded or renamed into the "
                        "lake, by reason; the spool keeps their events",
    "open_file_events": "Events in the Parquet file being written: spooled, not yet in the "
                        "lake",
    "file_closes_in_seconds": "Seconds until the open Parquet file closes and its events can "
                              "be queried (0 with none open)",
}


@dataclass(slots=True)
class ParquetCounts:
    files_written: int = 0  # files published under their final key
    bytes_written: int = 0  # Parquet bytes of those files
    events_written: int = 0  # rows in those files
    write_failures: Counter[str] = field(default_factory=Counter)  # decoding, staging: by kind
    publish_failures: Counter[str] = field(default_factory=Counter)  # upload or rename: by kind

    def file_published(self, size: int, events: int) -> None:
        self.files_written += 1
        self.bytes_written += size
        self.events_written += events

    def failed(self, phase: str, kind: str) -> int:
        """Count one failure; returns how many of this phase and kind so far."""
        by_kind = self.publish_failures if phase == "publish" else self.write_failures
        by_kind[kind] += 1
        return by_kind[kind]

    def as_counters(self) -> list[SinkCounter]:
        out = [SinkCounter("files_written", self.files_written),
               SinkCounter("bytes_written", self.bytes_written),
               SinkCounter("events_written", self.events_written)]
        out += [SinkCounter("write_failures", n, kind) for kind, n in
                sorted(self.write_failures.items())]
        out += [SinkCounter("publish_failures", n, kind) for kind, n in
                sorted(self.publish_failures.items())]
        return out
