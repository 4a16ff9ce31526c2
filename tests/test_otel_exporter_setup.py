"""An OTel service pointed at the agent the way the Collector's docs tell people to:
environment variables, no code of evagg's. What its exporter logs, what is stored, and
what the RED metrics count of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agentproc import REPO, AgentProcess
from tests.commands import evagg, evagg_sql
from tests.otel_exporter_log import exporter_errors


def export_one_span_from_env() -> str:
    """One span through an OTLPSpanExporter() configured only by OTEL_* variables."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "checkout"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    with provider.get_tracer("shop").start_as_current_span("pay") as span:
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    return trace_id


def test_a_traces_endpoint_without_its_path_is_refused_naming_the_one_meant(
        agent: AgentProcess, monkeypatch: pytest.MonkeyPatch,
        exporter_log: pytest.LogCaptureFixture) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as given, so the agent's address alone
    posts to "/": the exporter logged `404, reason: Not Found` and dropped every span."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", agent.http_url)
    export_one_span_from_env()
    errors = exporter_errors(exporter_log)
    assert "spans batch code: 404, reason: nothing is taken at /" in errors, errors
    assert f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={agent.http_url}/v1/traces" in errors, errors
    assert agent.metric('evagg_bad_input_total{reason="no_signal_path",route="/"}') == 1

    # What the reason says to set works.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{agent.http_url}/v1/traces")
    trace_id = export_one_span_from_env()
    assert agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 1) == [
        ("pay",)]


def test_a_span_that_handled_an_exception_is_no_error_in_the_red_metrics(
        agent: AgentProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OTel span fails by its status. A lookup that recorded a KeyError it handled
    (status left unset) was counted in evagg_event_errors_total, while `evagg query
    traces` and the dashboard called its trace one without failures."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", agent.http_url)
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("shop")
    with tracer.start_as_current_span("lookup") as lookup:
        try:
            raise KeyError("sku-1")  # a cache miss, answered from the database
        except KeyError as exc:
            lookup.record_exception(exc)
        trace_id = f"{lookup.get_span_context().trace_id:032x}"
    with pytest.raises(ValueError), tracer.start_as_current_span("charge"):
        raise ValueError("card declined")
    provider.shutdown()

    assert agent.wait_rows(f"SELECT name, state, error_type FROM events WHERE trace_id = "
                           f"'{trace_id}'", 1) == [("lookup", "FINISHED", "KeyError")]
    agent.wait_rows("SELECT name FROM events WHERE name = 'charge'", 1)
    assert agent.metric('evagg_events_total{kind="span",name="lookup",service="shop",'
                        'state="FINISHED"}') == 1
    assert agent.metric('evagg_event_errors_total{kind="span",name="charge",service="shop",'
                        'error_type="ValueError"}') == 1
    assert agent.metric('evagg_event_errors_total{kind="span",name="lookup",') == 0


def test_a_failed_spans_exception_keeps_its_own_message_beside_the_status_message(
        agent: AgentProcess, tmp_path: Path) -> None:
    """A handler that records the exception and sets its own status message ("payment
    failed"): the exception's message ("card declined") was lost, and `evagg
    export-traces` gave the status message as the exception's, on both exporters."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Status, StatusCode

    import emitters
    from emitters import otel

    socket_exporter = otel.EvaggSpanExporter(emitters.Emitter(socket=str(agent.socket_path)))
    provider = TracerProvider(resource=Resource.create({"service.name": "payments"}))
    provider.add_span_processor(SimpleSpanProcessor(socket_exporter))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    with provider.get_tracer("shop").start_as_current_span("charge") as span:
        try:
            raise ValueError("card declined")
        except ValueError as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, "payment failed"))
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)

    rows = agent.wait_rows("SELECT error_type, error_message, attrs['exception.message'] "
                           f"FROM events WHERE trace_id = '{trace_id}'", 2)
    assert rows == [("ValueError", "payment failed", "card declined")] * 2

    out = tmp_path / "trace.json"
    done = evagg("export-traces", "--data", str(agent.lake_dir), "--trace-id", trace_id,
                 "--out", str(out), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    [exported] = orjson.loads(out.read_bytes())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert exported["status"] == {"code": 2, "message": "payment failed"}
    [exception] = exported["events"]
    assert {"key": "exception.message", "value": {"stringValue": "card declined"}} in exception[
        "attributes"]
    assert "exception.message" not in {a["key"] for a in exported["attributes"]}


def test_an_otlp_grpc_exporter_at_the_port_is_told_in_one_line_to_send_http(
        agent: AgentProcess) -> None:
    """OTLP/gRPC (several SDKs' default protocol) at the agent's HTTP/1.1 port: the agent
    logged an ERROR with a traceback of binary HTTP/2 frames under aiohttp's logger for
    each try, saying neither what the client was nor what to set."""
    grpc = pytest.importorskip("grpc")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    channel = grpc.insecure_channel(agent.http_url.removeprefix("http://"))
    export = channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as refused:
            export(ExportTraceServiceRequest().SerializeToString(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()

    log = agent.log_path.read_text()
    assert "Traceback" not in log and "PRI/Upgrade" not in log, log
    said = [line for line in log.splitlines() if "spoke HTTP/2" in line]
    assert len(said) == 1 and "WARNING" in said[0], log
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in said[0]
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT={agent.http_url}" in said[0]
    assert agent.metric('evagg_bad_input_total{reason="http2_client",route="http"}') >= 1


def test_a_span_set_ok_is_told_from_one_left_unset_and_exported_so(
        agent: AgentProcess, tmp_path: Path) -> None:
    """Status OK and status unset were both stored as FINISHED and nothing else, so a
    span an instrumentation marked OK came back from `evagg export-traces` unset."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Status, StatusCode

    import emitters
    from emitters import otel

    socket_exporter = otel.EvaggSpanExporter(emitters.Emitter(socket=str(agent.socket_path)))
    provider = TracerProvider(resource=Resource.create({"service.name": "payments"}))
    provider.add_span_processor(SimpleSpanProcessor(socket_exporter))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    tracer = provider.get_tracer("shop")
    with tracer.start_as_current_span("charge") as root:
        root.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span("validate"):
            pass
        trace_id = f"{root.get_span_context().trace_id:032x}"
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)

    rows = agent.wait_rows("SELECT name, state, attrs['otel.status_code'] FROM events "
                           f"WHERE trace_id = '{trace_id}' ORDER BY name", 4)
    assert rows == [("charge", "FINISHED", "OK")] * 2 + [("validate", "FINISHED", None)] * 2

    out = tmp_path / "trace.json"
    done = evagg("export-traces", "--data", str(agent.lake_dir), "--trace-id", trace_id,
                 "--out", str(out), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    spans = {span["name"]: span for span in
             orjson.loads(out.read_bytes())["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    assert spans["charge"]["status"] == {"code": 1}
    assert "status" not in spans["validate"]
    assert "otel.status_code" not in {a["key"] for a in spans["charge"]["attributes"]}


def test_the_spans_view_names_the_internal_kind_the_span_was_stored_without(
        agent: AgentProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """An INTERNAL span (the SDK's default kind) is stored without otel.span_kind, and the
    spans view gave it no span_kind: `WHERE span_kind = 'INTERNAL'` found none."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind


    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", agent.http_url)
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("shop")
    with tracer.start_as_current_span("GET /cart", kind=SpanKind.SERVER) as root, \
            tracer.start_as_current_span("render"):
        trace_id = f"{root.get_span_context().trace_id:032x}"
    provider.shutdown()
    agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 2)

    rows = evagg_sql(agent.lake_dir)(
        f"SELECT name, span_kind FROM spans WHERE trace_id = '{trace_id}' ORDER BY name")
    assert rows == [{"name": "GET /cart", "span_kind": "SERVER"},
                    {"name": "render", "span_kind": "INTERNAL"}]


def test_a_services_process_pid_comes_back_from_the_export_as_an_int(
        agent: AgentProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/opentelemetry.md: process.pid comes back as an int. From OTLP, where the pid
    is the resource's attribute and the pid column stays empty, it came back as text."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", agent.http_url)
    provider = TracerProvider(resource=Resource.create({"service.name": "shop",
                                                        "process.pid": 4242}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    with provider.get_tracer("shop").start_as_current_span("pay") as span:
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 1)

    out = tmp_path / "trace.json"
    done = evagg("export-traces", "--data", str(agent.lake_dir), "--trace-id", trace_id,
                 "--out", str(out), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    [span_out] = orjson.loads(out.read_bytes())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert {"key": "process.pid", "value": {"intValue": "4242"}} in span_out["attributes"]


def test_an_agent_that_cannot_read_otlp_says_so_when_it_starts(
        agent_factory: Any, tmp_path: Path, exporter_log: pytest.LogCaptureFixture) -> None:
    """`pip install evagg` without [otel] has no OTLP messages: the agent answered each
    export 501, which the SDK does not retry, and its own log said nothing."""
    shadow = tmp_path / "no-otel"  # an environment without opentelemetry-proto
    (shadow / "opentelemetry").mkdir(parents=True)
    (shadow / "opentelemetry" / "__init__.py").write_text("")
    agent = agent_factory(env={"PYTHONPATH": f"{shadow}{os.pathsep}{REPO}"}).start()
    said = [line for line in agent.log_path.read_text().splitlines() if "501" in line]
    assert len(said) == 1 and "OTLP is off in this install" in said[0], said
    assert "pip install 'evagg[otel]'" in said[0]

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    with provider.get_tracer("shop").start_as_current_span("pay"):
        pass
    provider.shutdown()
    assert "spans batch code: 501, reason: this agent cannot read OTLP" in exporter_errors(
        exporter_log)
