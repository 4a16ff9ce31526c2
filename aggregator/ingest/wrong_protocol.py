"""What the agent logs when a client speaks HTTP/2 to its HTTP/1.1 port.

An OTLP/gRPC exporter (the default protocol of several SDKs, and of the Collector's
port 4317) pointed at the agent opens with HTTP/2's preface. aiohttp answers 400 and logged
each try as an ERROR with a traceback of binary frames under `aiohttp.server`, once per
reconnect of the exporter's backoff, naming neither the exporter nor the fix. The
agent's HTTP server logs through `ServerLog` instead: that case becomes one warning a
minute saying what to set, counted as bad input; anything else is logged as aiohttp
would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from emitters.ratelimit import RateLimitedLog

HTTP2_PREFACE = "PRI/Upgrade"  # in aiohttp's BadHttpMessage for "PRI * HTTP/2.0"
HTTP2_CLIENT = ("a client spoke HTTP/2 to this HTTP/1.1 port (%s), as an OTLP/gRPC exporter "
                "does: the agent takes OTLP over HTTP only. Set OTEL_EXPORTER_OTLP_PROTOCOL="
                "http/protobuf and OTEL_EXPORTER_OTLP_ENDPOINT=http://%s (not a gRPC port "
                "such as 4317)")


class ServerLog(logging.Filter):
    """A filter on the HTTP server's logger that turns an HTTP/2 client's error record
    into the HTTP2_CLIENT warning, at most once a minute, and tells `on_http2`."""

    def __init__(self, listen: str, on_http2: Callable[[], None]) -> None:
        super().__init__()
        self.listen = listen
        self.on_http2 = on_http2
        self.logger = logging.getLogger("evagg.agent.http")
        self.logger.addFilter(self)
        self._said = RateLimitedLog(logging.getLogger("evagg.agent"))

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or HTTP2_PREFACE not in str(error):
            return True
        self.on_http2()
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        self._said.log(logging.WARNING, "http2", HTTP2_CLIENT, f"from {remote}", self.listen)
        return False

    def close(self) -> None:
        self.logger.removeFilter(self)
