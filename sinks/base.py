"""The sink contract: what the delivery loop asks of every sink.

A sink never raises into the delivery loop: every method returns a `SinkResult`.
The loop gives each sink the records after that sink's cursor, in order. A sink may
buffer records (the Parquet sink fills a file); it reports in `durable_through` the
highest offset that is now safely delivered, and the loop commits the cursor there.
After any failure the loop calls `abandon()` and, after a backoff, starts again from
the committed cursor (the backoff grows with failures in a row; a success, progress or
`peer_ok`, ends the run), so a sink must tolerate seeing records again (the Parquet sink
derives its file name from the first offset; the HTTP sink sends an Idempotency-Key).

A sink reports its own counts through `counters()`; the agent exports each one on
/metrics as `evagg_sink_<name>_total{sink, type[, reason]}` (docs/metrics.md), and the
values it has now through `gauges()`, as `evagg_sink_<name>{sink, type}`.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from sinks.records import SpoolRecord


@dataclass(frozen=True, slots=True)
class SinkResult:
    ok: bool
    durable_through: int | None = None  # highest offset now delivered, if any
    delivered_events: int = 0  # events that became durable with this call
    error: str | None = None  # short reason, for logs and metrics labels
    error_kind: str | None = None  # bounded label: "timeout", "http_5xx", "throttled", ...
    # the peer asked us to wait this long; on a permanent failure, how soon what the sink
    # watches may have fixed it (a credentials file it reads again), else the loop's minute
    retry_after_s: float | None = None
    permanent: bool = False  # retrying soon will not help (bad credentials, missing bucket)
    # The peer accepted something since the last result, even if the cursor cannot move
    # yet (an earlier batch is still out): the sink is not down.
    peer_ok: bool = False

    @staticmethod
    def success(durable_through: int | None = None, delivered_events: int = 0, *,
                peer_ok: bool = False) -> SinkResult:
        return SinkResult(True, durable_through, delivered_events, peer_ok=peer_ok)

    @staticmethod
    def failure(
        error: str,
        error_kind: str,
        *,
        retry_after_s: float | None = None,
        permanent: bool = False,
    ) -> SinkResult:
        return SinkResult(
            False, None, 0, error, error_kind, retry_after_s=retry_after_s, permanent=permanent
        )


_COUNTER_WORD: Final = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class SinkCounter:
    """One count a sink keeps since it was built (a reload builds it anew).

    `name` and `reason` are short fixed words chosen by the sink's code (lower case,
    digits, `_`), never data: they become a metric name and a label value, so each sink
    has a bounded, documented set of them (docs/metrics.md). `reason` splits a count by
    a bounded class, as failures by error kind.
    """

    name: str
    value: int
    reason: str | None = None

    def __post_init__(self) -> None:
        for word in (self.name, self.reason):
            if word is not None and not _COUNTER_WORD.match(word):
                raise ValueError(f"sink counter word {word!r}: use a-z, 0-9 and _")


class Sink(abc.ABC):
    """Base class of every sink. Subclasses implement the four coroutines."""

    # The `type` label of this sink's counters: the config's `type` of the sink.
    sink_type: ClassVar[str] = "custom"
    # What each name of counters() and gauges() measures, in a few words: /metrics'
    # HELP (the long form, with what to do, is docs/metrics.md).
    metric_help: ClassVar[Mapping[str, str]] = {}
    # Spool bytes handed to one write(): bounds the sink's decode/encode working set.
    read_max_bytes: int = 4 * 2**20

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    async def write(self, records: Sequence[SpoolRecord]) -> SinkResult:
        """Take the next records in offset order."""

    @abc.abstractmethod
    async def flush(self, *, final: bool = False) -> SinkResult:
        """Called on a timer and at shutdown: deliver what is due (all of it when final)."""

    @abc.abstractmethod
    async def abandon(self) -> None:
        """Forget buffered, undelivered state; the loop will resend from the cursor."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and files. Called once, after the last flush."""

    def describe(self) -> str:
        """Where this sink delivers, for logs and `evagg status` (never a secret)."""
        return self.name

    def counters(self) -> Sequence[SinkCounter]:
        """This sink's own counts since it was built; none by default. Called on the
        event loop at every /metrics scrape and heartbeat: keep it cheap, never raise."""
        return ()

    def gauges(self) -> Mapping[str, float]:
        """Values this sink has now, not counts (the HTTP sink's concurrency limit), named
        as counters are; none by default. The same rules as `counters()`."""
        return {}
