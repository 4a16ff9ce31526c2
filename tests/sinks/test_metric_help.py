"""Every count and value a sink exports has its own words for /metrics' HELP.

A name without words falls back to one generic sentence shared by all: the family then
says nothing in a dashboard builder's metric browser. Names are taken from the code
that makes them, so a counter added or renamed without its words fails here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sinks.http.recent import RecentRequests
from sinks.http.sink import _METRICS, HttpSink
from sinks.parquet.counts import ParquetCounts
from sinks.parquet.hour_compaction import HourCompaction
from sinks.parquet.options import S3Options
from sinks.parquet.s3 import _EXPORTED_STATS
from sinks.parquet.sink import ParquetSink

HTTP_GAUGES = ("concurrency_limit", "requests_in_flight", "answer_latency_seconds",
               "dead_letters_waiting_events", "header_files_unusable",
               "requests_failing_since_timestamp_seconds", *RecentRequests().gauges())
PARQUET_GAUGES = ("open_file_events", "file_closes_in_seconds")


def test_every_http_count_and_value_has_words() -> None:
    missing = [n for n in (*_METRICS, *HTTP_GAUGES) if not HttpSink.metric_help.get(n)]
    assert missing == []


def test_every_parquet_count_and_value_has_words(tmp_path: Path) -> None:
    counts = ParquetCounts(write_failures=Counter(x=1), publish_failures=Counter(y=1))
    merge = HourCompaction(str(tmp_path), "n", s3=S3Options(), after_s=1.0)
    merge.failures["no_room"] += 1
    names = {c.name for c in (*counts.as_counters(), *merge.counters())}
    names |= {*_EXPORTED_STATS.values(), *PARQUET_GAUGES}
    missing = sorted(n for n in names if not ParquetSink.metric_help.get(n))
    assert missing == []
    words = list(ParquetSink.metric_help.values()) + list(HttpSink.metric_help.values())
    assert len(set(words)) == len(words)  # no two families say the same
