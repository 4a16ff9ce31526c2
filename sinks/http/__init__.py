"""The HTTP sink: batches of events POSTed to an endpoint, with retries and dead letters."""

from sinks.http.endpoint import HttpSinkConfigError
from sinks.http.sink import HttpSink, validate_http_sink_config

__all__ = ["HttpSink", "HttpSinkConfigError", "validate_http_sink_config"]
