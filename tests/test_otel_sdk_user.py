"""What an engineer whose services already use the OpenTelemetry SDK meets: the SDK's own
OTLP/HTTP exporters, configured as its docs say, against a real agent process.

Each test here does what such a user did, and checks what they saw: the exporter's log
line, what `evagg query` and `evagg export-traces` give back, and the agent's counts.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agentproc import AgentProcess
from tests.otel_exporter_log import EXPORTER_LOGGER, exporter_errors


def export_one_span(endpoint: str, **exporter_args: Any) -> str:
    """One ended span through the SDK's OTLPSpanExporter; its trace id."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "checkout"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint,
                                                                     **exporter_args)))
    with provider.get_tracer("shop").start_as_current_span("pay") as span:
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    return trace_id


@pytest.mark.parametrize("compression", ["Gzip", "Deflate"])
def test_the_exporters_compressions_are_taken(agent: AgentProcess, compression: str,
                                              exporter_log: pytest.LogCaptureFixture) -> None:
    """OTEL_EXPORTER_OTLP_COMPRESSION=deflate, or Compression.Deflate: the agent said 415
    to it, and the SDK dropped every span with a line in its log."""
    from opentelemetry.exporter.otlp.proto.http import Compression

    trace_id = export_one_span(f"{agent.http_url}/v1/traces",
                               compression=getattr(Compression, compression))
    agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 1)
    assert exporter_errors(exporter_log) == ""


def test_metrics_and_logs_sent_beside_traces_are_refused_saying_why_and_counted(
        agent: AgentProcess, exporter_log: pytest.LogCaptureFixture) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT at the agent sends metrics and logs to /v1/metrics and
    /v1/logs too. The agent stores traces only: the exporter's log must say so, not
    `404, reason: Not Found`, and the agent counts what it turned away."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{agent.http_url}/v1/metrics"),
        export_interval_millis=3_600_000)
    meters = MeterProvider(metric_readers=[reader])
    meters.get_meter("shop").create_counter("orders").add(3)
    meters.shutdown()

    loggers = LoggerProvider()
    loggers.add_log_record_processor(SimpleLogRecordProcessor(
        OTLPLogExporter(endpoint=f"{agent.http_url}/v1/logs")))
    app_log = logging.getLogger("shop.app")
    with warnings.catch_warnings():  # the SDK's handler, deprecated for a separate package
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(logger_provider=loggers)
    app_log.addHandler(handler)
    try:
        app_log.warning("card declined")
    finally:
        app_log.removeHandler(handler)
        loggers.shutdown()

    errors = exporter_errors(exporter_log)
    assert "metrics batch code: 404, reason: this agent takes OTLP traces only" in errors, errors
    assert "OTEL_METRICS_EXPORTER=none" in errors
    assert "logs batch code: 404, reason: this agent takes OTLP traces only" in errors, errors
    assert "OTEL_LOGS_EXPORTER=none" in errors
    for route in ("/v1/metrics", "/v1/logs"):
        assert agent.metric(
            f'evagg_bad_input_total{{reason="signal_not_taken",route="{route}"}}') >= 1

    # The traces beside them are taken as ever.
    trace_id = export_one_span(f"{agent.http_url}/v1/traces")
    assert agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 1) == [
        ("pay",)]


def test_a_refused_export_says_why_in_the_sdk_exporters_log(
        agent_factory: Any, tmp_path: Path, exporter_log: pytest.LogCaptureFixture) -> None:
    """docs/opentelemetry.md: every refusal carries its reason 'so an exporter's log shows
    why'. The Python SDK logs the status line, not the body."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    agent = agent_factory(agent_toml=f'http_token_file = "{token}"').start()
    export_one_span(f"{agent.http_url}/v1/traces")  # no Authorization header
    errors = exporter_errors(exporter_log)
    assert "spans batch code: 401, reason: missing or wrong bearer token" in errors, errors


def test_spans_sent_while_the_agent_drains_are_retried_after_its_retry_after_saying_why(
        agent_factory: Any, exporter_log: pytest.LogCaptureFixture) -> None:
    """A draining agent answers 503 with Retry-After: the SDK waits that long and tries
    again, and its warning says why, as for any other refusal."""
    import signal
    import urllib.error
    import urllib.request

    from tests.agentproc import http_sink
    from tests.ports import free_port

    agent = agent_factory(sinks_toml=http_sink("away", f"http://127.0.0.1:{free_port()}/"),
                          drain_timeout="30s").start()
    export_one_span(f"{agent.http_url}/v1/traces")  # stays in the spool: its sink is down
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    while True:  # the port stays open while the agent drains
        try:
            urllib.request.urlopen(f"{agent.http_url}/readyz", timeout=2).close()
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            break
        assert time.monotonic() < deadline, "the agent never said it was draining"
        time.sleep(0.1)
    export_one_span(f"{agent.http_url}/v1/traces", timeout=8)
    warnings = "\n".join(r.getMessage() for r in exporter_log.records
                         if r.name.startswith(EXPORTER_LOGGER))
    assert ("Transient error the agent is draining encountered while exporting spans batch, "
            "retrying in 5.00s") in warnings, warnings
    agent.kill()


def test_span_events_survive_both_exporters_and_come_back_in_the_export(
        agent: AgentProcess, tmp_path: Path) -> None:
    """A span's events ('cache miss' at a time, with attributes) were dropped without a
    word: only the last `exception` event was kept, as the error columns."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import emitters
    from aggregator.cli.export_traces import export_traces
    from emitters import otel

    socket_exporter = otel.EvaggSpanExporter(emitters.Emitter(socket=str(agent.socket_path)))
    provider = TracerProvider(resource=Resource.create({"service.name": "checkout"}))
    provider.add_span_processor(SimpleSpanProcessor(socket_exporter))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    start = 1_790_000_000_123_456_789
    with provider.get_tracer("shop").start_as_current_span("pay", start_time=start,
                                                           end_on_exit=False) as span:
        span.add_event("cache miss", {"key": "cart:7", "tries": 3}, timestamp=start + 1_000)
        span.record_exception(TimeoutError("first try"), timestamp=start + 2_000)
        span.add_event("retry", timestamp=start + 3_000)
        span.record_exception(ValueError("card declined"), timestamp=start + 4_000)
        span.end(end_time=start + 5_000)
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)

    rows = agent.wait_rows("SELECT attrs['otel.events'], error_type, error_message FROM events "
                           "WHERE name = 'pay'", 2)
    assert rows[0] == rows[1]  # the socket and OTLP alike
    stored, error_type, error_message = rows[0]
    assert error_type == "ValueError" and error_message == "card declined"
    events = orjson.loads(stored)
    assert [(e["name"], e["time_unix_nano"]) for e in events] == [
        ("cache miss", start + 1_000), ("exception", start + 2_000), ("retry", start + 3_000)]
    assert events[0]["attributes"] == {"key": "cart:7", "tries": "3"}
    assert events[1]["attributes"]["exception.message"] == "first try"

    out = tmp_path / "trace.json"
    assert export_traces(str(agent.lake_dir), trace_id=trace_id, since=None, out=out) == 1  # one id
    for resource_spans in orjson.loads(out.read_bytes())["resourceSpans"]:
        for exported in resource_spans["scopeSpans"][0]["spans"]:
            assert [(e["name"], e["timeUnixNano"]) for e in exported["events"]] == [
                ("cache miss", str(start + 1_000)), ("exception", str(start + 2_000)),
                ("retry", str(start + 3_000)), ("exception", exported["endTimeUnixNano"])]
            assert {"key": "key", "value": {"stringValue": "cart:7"}} in exported["events"][0][
                "attributes"]
            assert "otel.events" not in {a["key"] for a in exported["attributes"]}


def test_a_spans_links_come_back_as_links_in_the_export(agent: AgentProcess,
                                                        tmp_path: Path) -> None:
    """A batch span links the requests it serves; Jaeger draws links as references. The
    export gave them back as a text attribute, `otel.links`, which no OTLP tool reads; and
    a link's own attributes (which message of the batch it was) were dropped on both
    exporters' ways in."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Link

    import emitters
    from aggregator.cli.export_traces import export_traces
    from emitters import otel

    socket_exporter = otel.EvaggSpanExporter(emitters.Emitter(socket=str(agent.socket_path)))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(socket_exporter))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    tracer = provider.get_tracer("shop")
    requests = []
    for _ in range(2):
        with tracer.start_as_current_span("request") as request:
            requests.append(request.get_span_context())
    links = [Link(requests[0], {"messaging.message.id": "m-7", "batch.index": 0}),
             Link(requests[1])]
    with tracer.start_as_current_span("batch", links=links) as batch:
        trace_id = f"{batch.get_span_context().trace_id:032x}"
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)
    rows = agent.wait_rows("SELECT attrs['otel.links'] FROM events WHERE name = 'batch'", 2)
    assert rows[0] == rows[1]  # the socket and OTLP alike

    out = tmp_path / "trace.json"
    assert export_traces(str(agent.lake_dir), trace_id=trace_id, since=None, out=out) == 1
    document = orjson.loads(out.read_bytes())
    (exported,) = [span for resource in document["resourceSpans"]  # the same span: once
                   for scope in resource["scopeSpans"] for span in scope["spans"]
                   if span["name"] == "batch"]
    assert exported["links"] == [
        {"traceId": f"{requests[0].trace_id:032x}", "spanId": f"{requests[0].span_id:016x}",
         "attributes": [{"key": "batch.index", "value": {"stringValue": "0"}},
                        {"key": "messaging.message.id", "value": {"stringValue": "m-7"}}]},
        {"traceId": f"{requests[1].trace_id:032x}", "spanId": f"{requests[1].span_id:016x}"}]
    assert "otel.links" not in {a["key"] for a in exported["attributes"]}
    for item in [exported, *exported["links"]]:  # strict parse: OTLP JSON as a tool reads it
        for key in ("traceId", "spanId"):
            item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
    json_format.ParseDict(document, trace_service_pb2.ExportTraceServiceRequest())


def test_what_the_sdks_span_limits_dropped_is_kept_as_counts_on_both_paths(
        agent: AgentProcess, tmp_path: Path) -> None:
    """The SDK keeps 128 attributes, events and links a span by default and reports how
    many more it dropped; evagg threw the counts away, so a span cut short looked whole."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Link, SpanContext

    import emitters
    from aggregator.cli.export_traces import export_traces
    from emitters import otel

    socket_exporter = otel.EvaggSpanExporter(emitters.Emitter(socket=str(agent.socket_path)))
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2, max_events=1,
                                                     max_links=1))
    provider.add_span_processor(SimpleSpanProcessor(socket_exporter))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    links = [Link(SpanContext(trace_id=i, span_id=i, is_remote=True)) for i in (1, 2, 3)]
    with provider.get_tracer("shop").start_as_current_span(
            "cart", attributes={f"item.{i}": i for i in range(5)}, links=links) as span:
        for i in range(4):
            span.add_event(f"scan-{i}")
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)

    rows = agent.wait_rows("SELECT attrs['otel.dropped_attributes'], attrs['otel.dropped_events'], "
                           "attrs['otel.dropped_links'] FROM events WHERE name = 'cart'", 2)
    assert rows == [("3", "3", "2")] * 2  # the socket and OTLP alike
    out = tmp_path / "trace.json"
    assert export_traces(str(agent.lake_dir), trace_id=trace_id, since=None, out=out) == 1
    exported = orjson.loads(out.read_bytes())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert (exported["droppedAttributesCount"], exported["droppedEventsCount"],
            exported["droppedLinksCount"]) == (3, 3, 2)


def test_query_trace_with_what_is_not_a_trace_id_is_a_usage_error(agent: AgentProcess) -> None:
    """`evagg query` exits 2 on bad input and 1 on missing data; a mistyped id (a span id
    pasted, a cut-off trace id) said 'no spans for trace' and exit 1, as if the trace
    were only not there yet. export-traces already says what a trace id is."""
    from tests.aggregator.cli.newcomer import evagg

    trace_id = export_one_span(f"{agent.http_url}/v1/traces")
    agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 1)
    lake = str(agent.lake_dir)
    for wrong in (trace_id[:16], trace_id + "0", "0" * 32, "not-hex"):
        done = evagg("query", "--data", lake, "trace", wrong)
        assert done.returncode == 2, (wrong, done.stdout, done.stderr)
        assert "is not a trace id: one is 32 hex digits" in done.stderr, done.stderr
    done = evagg("query", "--data", lake, "trace", trace_id.upper())
    assert done.returncode == 0 and "pay" in done.stdout, done.stderr
    done = evagg("query", "--data", lake, "trace", "1" * 32)
    assert done.returncode == 1 and "no spans for trace" in done.stderr, done.stderr


def test_spans_refused_by_a_full_spool_are_taken_when_room_comes_within_the_exporters_timeout(
        agent_factory: Any, servers: Any, exporter_log: pytest.LogCaptureFixture) -> None:
    """A full spool under `when_full = "block"` holds a request 5 s for room, then answers
    503. With `Retry-After: 5` on top, the SDK's 10 s export timeout had no time left for
    a second try: room that came 6 s in was too late, and the batch was dropped."""
    import threading
    import urllib.error
    import urllib.request

    from tests.agentproc import http_sink

    endpoint = servers()
    endpoint.answer_always(503)
    agent = agent_factory(sinks_toml=http_sink("collector", endpoint.url),
                          agent_toml='max_frame = "64KiB"',
                          spool_toml='max_bytes = "1MiB"\nsegment_bytes = "128KiB"\n'
                                     'when_full = "block"').start()
    line = b'{"kind": "task", "name": "filler", "attrs": {"pad": "' + b"x" * 400 + b'"}}\n'
    for lines in (100, 1):  # fill the spool to the brim
        while True:
            request = urllib.request.Request(f"{agent.http_url}/v1/events", data=line * lines)
            try:
                urllib.request.urlopen(request, timeout=30).close()
            except urllib.error.HTTPError as exc:
                assert exc.code == 503
                break
    back = threading.Timer(6.0, endpoint.answer_always, (200,))  # the collector comes back
    back.start()
    try:
        export_one_span(f"{agent.http_url}/v1/traces", timeout=10)  # the SDK's default
    finally:
        back.cancel()
    assert "Failed to export" not in exporter_errors(exporter_log), exporter_errors(exporter_log)
    deadline = time.monotonic() + 60
    while not any(e.get("name") == "pay" for e in endpoint.accepted_events()):
        assert time.monotonic() < deadline, "the span never reached the collector"
        time.sleep(0.2)
