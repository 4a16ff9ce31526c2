"""Retry policy: which HTTP answers (and requests that got none) are worth retrying, and
how long to wait first.

Waits are exponential backoff with full jitter: a uniform draw between zero and the
exponential ceiling spreads the retries of many agents that failed together, so a
recovering endpoint is not hit in lockstep. A peer's Retry-After is a floor: we never
come back sooner than it asked.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime

import aiohttp

from sinks.base import SinkResult
from sinks.http_tls import tls_failure_reason

MAX_RETRY_AFTER_S = 3600.0  # a peer asking for more than an hour is more likely wrong


def backoff_delay(
    attempt: int,
    base: float = 0.1,
    cap: float = 60.0,
    retry_after: float | None = None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number `attempt` (1 for the first retry).

    The ceiling doubles with each attempt from `base` up to `cap`; the delay is drawn
    uniformly below it. `retry_after`, when given, is a lower bound (itself at most
    MAX_RETRY_AFTER_S), even above `cap`: the peer knows its own state better.
    """
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base overflows nothing, cap bounds it
    ceiling = min(cap, base * (2.0**exponent))
    delay = rng() * max(ceiling, 0.0)
    if retry_after is not None:
        delay = max(delay, min(max(retry_after, 0.0), MAX_RETRY_AFTER_S))
    return delay


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds asked for by a Retry-After header: delta-seconds or an HTTP date.

    Returns None when the header is absent or unreadable (the caller falls back to its
    own backoff); a date in the past means "now" (0.0).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" parses without a zone; HTTP dates are GMT anyway
        when = when.replace(tzinfo=dt.UTC)
    current = time.time() if now is None else now
    return min(max(when.timestamp() - current, 0.0), MAX_RETRY_AFTER_S)


def failure_for_status(status: int, retry_after: float | None = None) -> SinkResult | None:
    """What a non-2xx answer means for the delivery loop; None for a permanent refusal of
    the batch itself (400, 404, 413, 422, ...), which the sink dead-letters."""
    if status == 429:
        return SinkResult.failure("HTTP 429", "throttled", retry_after_s=retry_after)
    if status >= 500:
        return SinkResult.failure(f"HTTP {status}", "http_5xx", retry_after_s=retry_after)
    if status == 408:
        return SinkResult.failure("HTTP 408", "timeout", retry_after_s=retry_after)
    if status in (401, 403):  # the credentials, not the batch: keep the data spooled
        return SinkResult.failure(f"HTTP {status}: check the credentials", "http_auth",
                                  permanent=True)
    if status == 407:  # a proxy's answer (to an http:// request), not the endpoint's
        return SinkResult.failure("HTTP 407: check the proxy's credentials", "http_auth",
                                  permanent=True)
    if not 400 <= status < 500:  # redirects are not followed: the URL needs fixing
        return SinkResult.failure(f"HTTP {status}: not followed, fix the url", "http_status",
                                  permanent=True)
    return None


def failure_for_error(exc: TimeoutError | aiohttp.ClientError, timeout_s: float
                      ) -> tuple[str, SinkResult]:
    """What a request that got no HTTP answer from the endpoint means: the sink's counter
    to raise, and the result. Proxy credentials and certificates outlast any backoff."""
    if isinstance(exc, TimeoutError):
        return "timeouts", SinkResult.failure(f"no answer within {timeout_s:g}s", "timeout")
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused the CONNECT
        if exc.status == 407:
            return "connect_errors", SinkResult.failure(
                "HTTP 407: check the proxy's credentials", "http_auth", permanent=True)
        return "connect_errors", SinkResult.failure(f"the proxy answered {exc.status}",
                                                    "connect")
    if isinstance(exc, aiohttp.ClientSSLError):
        return "tls_errors", SinkResult.failure(
            f"TLS handshake failed: {tls_failure_reason(exc)}", "tls", permanent=True)
    return "connect_errors", SinkResult.failure(
        f"cannot reach the endpoint: {type(exc).__name__}", "connect")
