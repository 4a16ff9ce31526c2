"""Which HTTP answers (and requests that got none) are worth retrying, what each means
for delivery (a retry, a permanent failure, or a batch to dead-letter), and what each
says about the endpoint's load (`sinks.http.concurrency`)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
from email.utils import parsedate_to_datetime

import aiohttp

from sinks.backoff import MAX_RETRY_AFTER_S
from sinks.base import SinkResult
from sinks.http.concurrency import Answer
from sinks.http.tls import tls_failure_reason

# Answers with which an endpoint (or the proxy in front of it) sheds load.
PUSHBACK_STATUSES = frozenset({408, 429, 502, 503, 504})


def load_answer(status: int) -> Answer:
    """What an HTTP answer says about the endpoint's load: pushback, or an answer (2xx, or
    a 4xx refusing the batch itself) whose latency is the endpoint's usual work."""
    if status in PUSHBACK_STATUSES:
        return Answer.OVERLOADED
    if 200 <= status < 300 or 400 <= status < 500:
        return Answer.HEALTHY
    return Answer.NEUTRAL  # a 500 is a bug of the endpoint, not its load


def load_answer_for_error(failure: SinkResult) -> Answer:
    """A request that got no answer: a timeout or a dropped connection is pushback; a
    certificate or a proxy's refusal says nothing about the endpoint's load."""
    return Answer.OVERLOADED if failure.error_kind in ("timeout", "connect") else Answer.NEUTRAL


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
    the batch itself (400, 413, 422, ...), which the sink dead-letters."""
    if status == 429:
        return SinkResult.failure("HTTP 429", "throttled", retry_after_s=retry_after)
    if status >= 500:
        return SinkResult.failure(f"HTTP {status}", "http_5xx", retry_after_s=retry_after)
    if status == 408:
        return SinkResult.failure("HTTP 408", "timeout", retry_after_s=retry_after)
    if status in (401, 403):  # the credentials, not the batch: keep the data spooled
        return SinkResult.failure(f"HTTP {status}: check the credentials", "http_auth",
                                  permanent=True)
    if status in (404, 405):  # the URL, not the batch: a typo'd path would dead-letter all
        return SinkResult.failure(f"HTTP {status}: the endpoint has no such path (or takes "
                                  "no POST there): check the sink's url", "http_url",
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
        reason = tls_failure_reason(exc)
        # an https:// URL whose endpoint answers in plain HTTP
        hint = "; the endpoint may speak plain HTTP: try http://" if reason == \
            "WRONG_VERSION_NUMBER" else ""
        if "self-signed" in reason or "local issuer" in reason:  # a private CA's certificate
            hint = ("; a certificate of a private CA (or a self-signed one) is trusted with "
                    "tls_ca_file = \"<its CA's PEM>\"")
        return "tls_errors", SinkResult.failure(
            f"TLS handshake failed: {reason}{hint}", "tls", permanent=True)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_errors", SinkResult.failure(
            f"cannot reach the endpoint: {_no_answer_reason(exc)}", "connect")
    # Connected, then the connection broke before an answer: the endpoint (or a balancer
    # before it) is the one to look at, not the network or DNS.
    return "connect_errors", SinkResult.failure(
        f"the connection broke before an answer: {_no_answer_reason(exc)}", "connect")


def _no_answer_reason(exc: aiohttp.ClientError) -> str:
    """What a user reads for a request that got no answer: the operating system's words
    ("Connection refused") where there are some, not a Python class name alone."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the endpoint closed the connection before answering"
    error = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(error, socket.gaierror):  # its errno is the resolver's, not the OS's
        host = exc.host if isinstance(exc, aiohttp.ClientConnectorError) else "the host"
        return f"{host} does not resolve (DNS: {error.strerror or error})"
    if isinstance(error, OSError) and error.errno:
        return os.strerror(error.errno).lower()  # asyncio's own text names the address only
    return type(exc).__name__
