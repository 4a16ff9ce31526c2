"""What each of the HTTP sink's own counts and values measures, in a few words: the HELP
of its /metrics families (`Sink.metric_help`). docs/metrics.md has the long form, with
what to do about each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

METRIC_HELP: Final[Mapping[str, str]] = {
    "requests_2xx": "HTTP requests answered 2xx",
    "requests_3xx": "HTTP requests answered 3xx",
    "requests_4xx": "HTTP requests answered 4xx",
    "requests_5xx": "HTTP requests answered 5xx",
    "requests_failed": "HTTP requests without an answer, whatever the cause",
    "timeouts": "HTTP requests that timed out",
    "connect_errors": "HTTP requests that could not connect",
    "tls_errors": "HTTP requests that failed in TLS",
    "internal_errors": "HTTP requests that failed inside the sink",
    "retries": "HTTP batches sent again",
    "dead_lettered_batches": "HTTP batches refused for good (4xx), kept for evagg dlq replay",
    "dead_lettered_events": "Events refused for good (4xx), kept for evagg dlq replay",
    "split_batches": "HTTP batches refused as too large (413), sent again in halves",
    "bytes_sent": "Request body bytes the endpoint accepted (after gzip)",
    "events_sent": "Events the endpoint accepted",
    "concurrency_limit": "Requests the HTTP sink may have in flight now (adaptive: follows the "
                         "endpoint up to max_in_flight)",
    "requests_in_flight": "HTTP requests open now",
    "answer_latency_seconds": "Moving average of the endpoint's answer time in seconds, "
                              "request start to last byte (0 before the first answer)",
    "requests_failing_since_timestamp_seconds": "When the HTTP sink's requests began to fail "
                                                "in a row, Unix time (0 while answered)",
    "recent_requests": "HTTP requests that ended in the last 5 minutes, answered or not",
    "recent_requests_failed": "HTTP requests of the last 5 minutes that failed and were "
                              "retried (5xx, 429, timeouts, connection errors)",
    "recent_failures_connect": "HTTP requests of the last 5 minutes that could not connect "
                               "or lost the connection before an answer",
    "recent_failures_http_5xx": "HTTP requests of the last 5 minutes answered 5xx",
    "recent_failures_throttled": "HTTP requests of the last 5 minutes answered 429",
    "recent_failures_timeout": "HTTP requests of the last 5 minutes that timed out (or 408)",
    "dead_letters_waiting_events": "Events in the HTTP sink's dead letters on disk, waiting "
                                   "for evagg dlq replay",
    "header_files_unusable": "file: headers whose file is gone, unreadable or empty now",
}
