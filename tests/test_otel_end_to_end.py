"""OpenTelemetry end to end: real SDK, real OTLP/HTTP exporter, real agent, Parquet, export.

A driver process opens a span and hands its context in a dict to two worker processes;
each opens a span with a child. Both paths (OTLP/HTTP to /v1/traces, and the socket
exporter) must store all five spans with the right parent links. This file is also the
driver/worker program: `python -m tests.test_otel_end_to_end driver|worker ...`.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agentproc import REPO, AgentProcess

PB = "application/x-protobuf"
SPAN_SQL = ("SELECT name, trace_id, span_id, parent_span_id, attrs['service.name'], pid, source "
            "FROM events WHERE kind = 'span'")


def run_driver(exporter: str, endpoint: str) -> None:
    from emitters import otel

    otel.init_telemetry("driver", exporter=exporter, endpoint=endpoint)
    with otel.get_tracer("e2e").start_as_current_span("driver") as span:
        meta = otel.inject_trace_context({})
        for i in range(2):
            subprocess.run([sys.executable, "-m", "tests.test_otel_end_to_end", "worker",
                            exporter, endpoint, str(i), orjson.dumps(meta).decode()],
                           check=True, timeout=60)
        ids = span.get_span_context()
    ok = otel.shutdown_telemetry(timeout_s=30)
    print(orjson.dumps({"trace_id": f"{ids.trace_id:032x}", "flushed": ok}).decode())


def run_worker(exporter: str, endpoint: str, index: int, meta: dict[str, str]) -> None:
    from emitters import otel

    otel.init_telemetry(f"worker-{index}", exporter=exporter, endpoint=endpoint)
    tracer = otel.get_tracer("e2e")
    with (otel.attach_trace_context(meta), tracer.start_as_current_span(f"worker-{index}"),
          tracer.start_as_current_span(f"inner-{index}")):
        pass
    assert otel.shutdown_telemetry(timeout_s=30)


def wait_rows(agent: AgentProcess, sql: str, count: int, timeout: float = 60) -> list[Any]:
    return agent.wait_rows(sql, count, timeout)


def drive(agent: AgentProcess, exporter: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EVAGG_SOCKET": str(agent.socket_path)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_otel_end_to_end", "driver", exporter,
         f"{agent.http_url}/v1/traces"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert result["flushed"] is True
    return str(result["trace_id"])


def check_tree(rows: list[Any], trace_id: str) -> dict[str, Any]:
    spans = {row[0]: row for row in rows}
    assert sorted(spans) == ["driver", "inner-0", "inner-1", "worker-0", "worker-1"]
    assert {row[1] for row in rows} == {trace_id}
    assert spans["driver"][3] is None
    for i in range(2):
        assert spans[f"worker-{i}"][3] == spans["driver"][2]
        assert spans[f"inner-{i}"][3] == spans[f"worker-{i}"][2]
        assert spans[f"inner-{i}"][4] == f"worker-{i}"
    return spans


@pytest.mark.parametrize("exporter", ["otlp", "evagg"])
def test_cross_process_trace_lands_with_parent_links(
    agent: AgentProcess, exporter: str, tmp_path: Path
) -> None:
    trace_id = drive(agent, exporter)
    spans = check_tree(wait_rows(agent, SPAN_SQL, 5), trace_id)
    assert {row[6] for row in spans.values()} == {"otel"}
    if exporter == "evagg":  # the socket's peer credentials name each process
        assert len({row[5] for row in spans.values()}) == 3
    check_jaeger_export(agent, trace_id, tmp_path / "trace.json")


def check_jaeger_export(agent: AgentProcess, trace_id: str, out: Path) -> None:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    from aggregator.cli.export_traces import export_traces
    from aggregator.decode import otlp

    assert export_traces(str(agent.lake_dir), trace_id=trace_id, since=None, out=out) == 5
    document = orjson.loads(out.read_bytes())
    services = {rs["resource"]["attributes"][0]["value"]["stringValue"]
                for rs in document["resourceSpans"]}
    assert services == {"driver", "worker-0", "worker-1"}
    for rs in document["resourceSpans"]:  # strict parse: no field unknown to OTLP
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    json_format.ParseDict(document, trace_service_pb2.ExportTraceServiceRequest())
    decoded = otlp.decode_otlp_traces(out.read_bytes(), otlp.JSON)
    assert decoded.rejected_spans == 0
    rows = [(r["name"], r["trace_id"], r["span_id"], r.get("parent_span_id"),
             r["attrs"].get("service.name"), None, None) for r in decoded.rows]
    check_tree([r[:5] for r in rows], trace_id)


def post(agent: AgentProcess, body: bytes, content_type: str,
         encoding: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})}
    request = urllib.request.Request(f"{agent.http_url}/v1/traces", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def request_with(names_and_ids: list[tuple[str, bytes, bytes]]) -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for name, trace_id, span_id in names_and_ids:
        span = scope.spans.add(name=name, trace_id=trace_id, span_id=span_id)
        span.start_time_unix_nano = time.time_ns()
        span.end_time_unix_nano = span.start_time_unix_nano + 1000
    return bytes(request.SerializeToString())


def test_bad_otlp_bodies_are_refused_and_nothing_of_them_is_spooled(agent: AgentProcess) -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    good = request_with([("kept", b"\x01" * 16, b"\x02" * 8), ("also-kept", b"\x01" * 16,
                                                                b"\x03" * 8)])
    cases = [
        (b"\xff\xfe garbage", PB, None, 400, b"invalid OTLP protobuf"),
        (good[: len(good) // 2], PB, None, 400, b"invalid OTLP protobuf"),
        (good, "text/plain", None, 415, b"unsupported Content-Type"),
        (b"\x1f\x8b\x08 broken gzip", PB, "gzip", 400, b"gzip"),
        (b'{"resourceSpans": 7}', "application/json", None, 400, b"invalid OTLP JSON"),
    ]
    from google.rpc import status_pb2  # what an OTLP exporter parses a refusal with

    for body, content_type, encoding, status, reason in cases:
        answer = post(agent, body, content_type, encoding)
        assert answer[0] == status, (content_type, answer)
        if content_type == PB:
            refusal = status_pb2.Status.FromString(answer[1])
            assert reason.decode() in refusal.message and refusal.code == 3, refusal
        elif content_type == "application/json":
            assert reason.decode() in orjson.loads(answer[1])["message"], answer
        else:
            assert reason in answer[1], answer
    assert agent.metric('evagg_received_events_total{route="otlp"}') == 0

    mixed = request_with([("zero-trace", bytes(16), b"\x04" * 8),
                          ("short-span", b"\x05" * 16, b"\x06" * 3),
                          ("good", b"\x07" * 16, b"\x08" * 8)])
    status, body = post(agent, gzip.compress(mixed), PB, "gzip")
    assert status == 200
    partial = trace_service_pb2.ExportTraceServiceResponse.FromString(body).partial_success
    assert partial.rejected_spans == 2
    assert "trace_id must be 16 bytes" in partial.error_message
    assert "span_id must be 8 bytes" in partial.error_message  # each refused span's reason
    assert agent.metric('evagg_received_events_total{route="otlp"}') == 1
    rows = wait_rows(agent, SPAN_SQL, 1)
    assert [row[0] for row in rows] == ["good"]
    assert rows[0][1:3] == ("07" * 16, "08" * 8)


# -- what an engineer sees with both exporters, big attributes and unended spans ------------

class RayTaskError(Exception):
    """Stands in for Ray's exception class: its name is what the span's event carries."""


def red_samples(agent: AgentProcess, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(agent.metrics())
            for s in family.samples if s.name == metric}


def both_ways_provider(agent: AgentProcess) -> tuple[Any, Any]:
    """One provider with the socket exporter and the OTLP exporter, as docs/opentelemetry.md
    offers both; its spans reach the agent twice."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import emitters
    from emitters import otel

    socket_exporter = otel.EvaggSpanExporter(emitters.Emitter(socket=str(agent.socket_path)))
    provider = TracerProvider(resource=Resource.create({"service.name": "learner"}))
    provider.add_span_processor(BatchSpanProcessor(socket_exporter))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    return provider, socket_exporter


def test_a_span_sent_both_ways_is_stored_under_one_id_and_counted_once(
        agent: AgentProcess) -> None:
    provider, socket_exporter = both_ways_provider(agent)
    tracer = provider.get_tracer("rl")
    for step in range(3):
        with tracer.start_as_current_span("rl_iteration", attributes={"step": step}):
            pass
    with (contextlib.suppress(RayTaskError), tracer.start_as_current_span("validate")):
        raise RayTaskError("\x1b[36mray::validate()\x1b[39m (pid=7) failed: ValueError")
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)
    rows = wait_rows(agent, "SELECT event_id, name, error_message FROM events "
                            "WHERE kind = 'span'", 8)
    assert len({row[0] for row in rows}) == 4  # each span's two copies share one id
    assert agent.query("SELECT count(DISTINCT event_id) FROM events WHERE kind = 'span'") == [(4,)]
    assert {row[2] for row in rows if row[1] == "validate"} == {
        "RayTaskError: ray::validate() (pid=7) failed: ValueError"}  # no terminal colours
    events = red_samples(agent, "evagg_events_total")
    service = ("service", "learner")
    assert events[(("kind", "span"), ("name", "rl_iteration"), service,
                   ("state", "FINISHED"))] == 3
    assert events[(("kind", "span"), ("name", "validate"), service, ("state", "FAILED"))] == 1
    errors = red_samples(agent, "evagg_event_errors_total")
    error_type = f"{__name__}.RayTaskError"
    assert errors == {(("error_type", error_type), ("kind", "span"), ("name", "validate"),
                       service): 1}
    durations = red_samples(agent, "evagg_event_duration_seconds_count")
    assert durations[(("kind", "span"), ("name", "rl_iteration"), service)] == 3


def test_a_span_with_a_huge_attribute_is_kept_with_the_value_cut_on_both_paths(
        agent: AgentProcess, tmp_path: Path) -> None:
    from aggregator.cli.export_traces import export_traces
    from emitters.integrations.otel_rows import VALUE_LIMIT

    provider, socket_exporter = both_ways_provider(agent)
    with provider.get_tracer("rl").start_as_current_span(
            "rollout", attributes={"prompt": "p" * (20 << 20), "small": "kept"}) as span:
        trace_id = f"{span.get_span_context().trace_id:032x}"
    provider.shutdown()
    assert socket_exporter.emitter.flush(30)
    rows = wait_rows(agent, "SELECT length(attrs['prompt']), attrs['evagg.cut_attributes'], "
                            "attrs['small'] FROM events WHERE name = 'rollout'", 2)
    assert rows == [(VALUE_LIMIT, '["prompt"]', "kept")] * 2  # socket and OTLP alike
    assert socket_exporter.cut_attributes == 1
    assert agent.metric('evagg_cut_attribute_values_total{route="otlp"}') == 1
    out = tmp_path / "trace.json"
    assert export_traces(str(agent.lake_dir), trace_id=trace_id, since=None, out=out) == 1
    assert out.stat().st_size < 4 * VALUE_LIMIT


def test_spans_that_never_ended_are_refused_with_the_reason_and_counted(
        agent: AgentProcess) -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    start = time.time_ns()
    for index, (name, end) in enumerate((("no-end", None), ("end-zero", 0),
                                         ("ends-before-start", start - 1),
                                         ("finished", start + 10**6))):
        span = scope.spans.add(name=name, trace_id=b"\x01" * 16,
                               span_id=bytes([index + 1]) * 8, start_time_unix_nano=start)
        if end is not None:
            span.end_time_unix_nano = end
    scope.spans.add(name="bad-id", trace_id=bytes(16), span_id=b"\x09" * 8,
                    start_time_unix_nano=start, end_time_unix_nano=start + 1)
    status, body = post(agent, request.SerializeToString(), PB)
    assert status == 200
    partial = trace_service_pb2.ExportTraceServiceResponse.FromString(body).partial_success
    assert partial.rejected_spans == 4
    assert "span 'no-end': endTimeUnixNano is missing" in partial.error_message
    for refused in ("end-zero", "ends-before-start", "bad-id"):  # each named, not the first
        assert f"span '{refused}': " in partial.error_message, partial.error_message
    assert agent.metric('evagg_rejected_events_total{route="otlp"}') == 4
    rows = wait_rows(agent, "SELECT name, duration_s FROM events WHERE kind = 'span'", 1)
    assert rows == [("finished", 0.001)]


def test_a_brotli_body_gets_415_with_a_status_saying_what_to_send(agent: AgentProcess) -> None:
    from google.rpc import status_pb2

    good = request_with([("kept", b"\x01" * 16, b"\x02" * 8)])
    status, body = post(agent, good, PB, "br")
    assert status == 415
    refusal = status_pb2.Status.FromString(body)
    assert "Content-Encoding 'br' is not supported (gzip, deflate or none)" in refusal.message
    status, body = post(agent, good, "text/plain")
    assert status == 415 and "unsupported Content-Type" in status_pb2.Status.FromString(
        body).message


@pytest.mark.parametrize(("encoding", "pack"), [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),  # HTTP's deflate: a zlib stream
    ("deflate", lambda body: zlib.compress(body, wbits=-15)),  # what some clients send
])
def test_gzip_and_deflate_bodies_are_stored(agent: AgentProcess, encoding: str,
                                            pack: Callable[[bytes], bytes]) -> None:
    """OTLP/HTTP names gzip only, but collectors take deflate too, and the SDKs can send
    it (Compression.Deflate): a deflate body is read like any other, not refused."""
    name = f"packed-{encoding}-{len(pack(b'x'))}"
    status, body = post(agent, pack(request_with([(name, os.urandom(16), os.urandom(8))])),
                         PB, encoding)
    assert status == 200, body
    assert wait_rows(agent, f"SELECT name FROM events WHERE name = '{name}'", 1) == [(name,)]


if __name__ == "__main__":
    if sys.argv[1] == "driver":
        run_driver(sys.argv[2], sys.argv[3])
    else:
        run_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), orjson.loads(sys.argv[5]))
