"""`evagg status`: each sink's health as words to act on, read from one /metrics sample.

The words (docs/operations.md's health table): `ok`; `retrying (connect) since 07:28:42
UTC, next in 12s` (the agent backs off and tries again); `failing (http_auth) since ...`
(a permanent error: the sink's config must change). An `ok` says what else an operator
needs: `ok, delivering since 07:28:42 UTC (35 s)` while one attempt runs longer than
LONG_ATTEMPT_S (a store that hangs: no failure is counted until its timeouts end it), and
`ok, but 41 of its 62 requests in the last 5 min failed (http_5xx 38, connect 3) and were
retried` for an HTTP endpoint that fails requests between answered ones.
"""

from __future__ import annotations

import re
from typing import Final

from aggregator.log_format import utc_clock

# A normal attempt (an upload, a batch of requests) takes well under a second; one that
# runs longer than this is worth a look, long before the store's own timeouts end it.
LONG_ATTEMPT_S: Final = 10.0
RECENT_FAILURES: Final = "evagg_sink_recent_failures_"

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def by_label(sample: dict[str, float], metric: str, label: str) -> dict[str, float]:
    """The series of `metric`, summed by the value of `label`."""
    out: dict[str, float] = {}
    for series, value in sample.items():
        name, _, labels = series.partition("{")
        if name != metric:
            continue
        found = dict(_LABEL.findall(labels))
        key = found.get(label, "")
        out[key] = out.get(key, 0.0) + value
    return out


def labelled(sample: dict[str, float], metric: str) -> list[tuple[dict[str, str], float]]:
    """The series of `metric`: each one's labels and value."""
    out: list[tuple[dict[str, str], float]] = []
    for series, value in sample.items():
        name, _, labels = series.partition("{")
        if name == metric:
            out.append((dict(_LABEL.findall(labels)), value))
    return out


def sink_health(sample: dict[str, float], now: float) -> dict[str, str]:
    """Each sink's health as words to act on (the module docstring)."""
    since = {labels.get("sink", ""): (labels.get("kind", "error"), value)
             for labels, value in labelled(sample, "evagg_sink_failing_since_timestamp_seconds")}
    retry = by_label(sample, "evagg_sink_next_retry_timestamp_seconds", "sink")
    permanent = by_label(sample, "evagg_sink_permanent_error", "sink")
    requests = by_label(sample, "evagg_sink_requests_failing_since_timestamp_seconds", "sink")
    sinks = set(by_label(sample, "evagg_sink_lag_events", "sink")) | set(since)
    out: dict[str, str] = {}
    for sink in sinks:
        if sink not in since and requests.get(sink):  # an HTTP sink retrying its requests
            out[sink] = (f"retrying (its requests fail) since {utc_clock(requests[sink])}"
                         ", retrying now")
            continue
        if sink not in since:
            out[sink] = "failing" if permanent.get(sink) else _ok(sample, sink, now)
            continue
        kind, started = since[sink]
        word = "failing" if permanent.get(sink) else "retrying"
        wait = retry.get(sink, 0.0) - now
        nxt = f"next in {wait:.0f}s" if wait >= 0.5 else "retrying now"
        out[sink] = f"{word} ({kind}) since {utc_clock(started)}, {nxt}"
    return out


def _ok(sample: dict[str, float], sink: str, now: float) -> str:
    """`ok`, and what an operator needs to know of a sink that has not failed (yet)."""
    started = by_label(sample, "evagg_sink_attempt_started_timestamp_seconds", "sink")
    running_s = now - started[sink] if started.get(sink) else 0.0
    if running_s > LONG_ATTEMPT_S:
        return f"ok, delivering since {utc_clock(started[sink])} ({running_s:.0f} s)"
    failed = by_label(sample, "evagg_sink_recent_requests_failed", "sink").get(sink, 0.0)
    if failed:
        total = by_label(sample, "evagg_sink_recent_requests", "sink").get(sink, 0.0)
        return (f"ok, but {failed:,.0f} of its {total:,.0f} requests in the last 5 min failed "
                f"({_failure_kinds(sample, sink)}) and were retried")
    return "ok"


def _failure_kinds(sample: dict[str, float], sink: str) -> str:
    """`http_5xx 38, connect 3`: the kinds of the recent failures, most frequent first."""
    kinds: dict[str, float] = {}
    for series, value in sample.items():
        name, _, labels = series.partition("{")
        if value and name.startswith(RECENT_FAILURES) and \
                dict(_LABEL.findall(labels)).get("sink") == sink:
            kinds[name.removeprefix(RECENT_FAILURES)] = value
    return ", ".join(f"{kind} {count:,.0f}" for kind, count in
                     sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
