"""The HTTP sink: batches of events POSTed to an endpoint, with retries and dead letters."""

from sinks.http.endpoint import HttpSinkConfigError
from sinks.http.options import HttpOptions
from sinks.http.sink import HttpSink

__all__ = ["HttpOptions", "HttpSink", "HttpSinkConfigError"]
