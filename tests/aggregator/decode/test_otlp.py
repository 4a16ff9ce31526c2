"""aggregator.decode.otlp against real OTel SDK spans encoded by the SDK's own OTLP encoder."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aggregator.decode import otlp
from aggregator.decode.normalize import Stamp, rows_to_batch

PB = "application/x-protobuf"
JS = "application/json"


def recorded_spans() -> list[ReadableSpan]:
    """A root, a child that fails with an exception, and a grandchild."""
    memory = InMemorySpanExporter()
    resource = Resource.create({"service.name": "trainer", "evagg.run_id": "run-7"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.otlp")
    with (tracer.start_as_current_span("root", attributes={"evagg.step": 12, "lr": 0.5}),
          pytest.raises(ValueError),
          tracer.start_as_current_span("child") as child):
        child.set_attribute("tags", ["a", "b"])
        with tracer.start_as_current_span("grandchild"):
            pass
        raise ValueError("boom")
    provider.shutdown()
    return list(memory.get_finished_spans())


def protobuf_body(spans: list[ReadableSpan]) -> bytes:
    return bytes(encode_spans(spans).SerializeToString())


def json_body(spans: list[ReadableSpan]) -> bytes:
    """OTLP JSON as the spec writes it: hex ids, integer enums."""
    data = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return orjson.dumps(data)


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def test_protobuf_spans_become_rows_with_parent_links_and_errors() -> None:
    spans = recorded_spans()
    decoded = otlp.decode_otlp_traces(protobuf_body(spans), PB)
    assert decoded.rejected_spans == 0 and decoded.error_message == ""
    rows = by_name(decoded.rows)
    root, child, grand = rows["root"], rows["child"], rows["grandchild"]
    assert {r["trace_id"] for r in rows.values()} == {f"{spans[0].context.trace_id:032x}"}
    assert "parent_span_id" not in root
    assert child["parent_span_id"] == root["span_id"]
    assert grand["parent_span_id"] == child["span_id"]
    assert (root["state"], child["state"], grand["state"]) == ("FINISHED", "FAILED", "FINISHED")
    assert child["error_type"] == "ValueError"
    assert child["error_message"] == "ValueError: boom"
    assert "raise ValueError" in child["stack_trace"]
    assert root["kind"] == "span" and root["source"] == "otel"
    assert root["run_id"] == "run-7" and root["step"] == 12
    assert root["attrs"]["service.name"] == "trainer"
    assert root["attrs"]["lr"] == "0.5"
    assert child["attrs"]["tags"] == '["a","b"]'
    source = {s.name: s for s in spans}["root"]
    assert root["time"] == source.start_time
    assert root["duration_s"] == pytest.approx((source.end_time - source.start_time) / 1e9)


def test_json_with_hex_ids_decodes_to_the_same_rows_as_protobuf() -> None:
    spans = recorded_spans()
    from_pb = otlp.decode_otlp_traces(protobuf_body(spans), PB).rows
    from_json = otlp.decode_otlp_traces(json_body(spans), f"{JS}; charset=utf-8").rows
    assert from_json == from_pb


def test_hand_written_spec_json_with_unknown_fields() -> None:
    body = {
        "resourceSpans": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": "svc"}}]},
            "scopeSpans": [{
                "scope": {"name": "lib"},
                "spans": [{
                    "traceId": "5B8EFFF798038103D269B633813FC60C",
                    "spanId": "EEE19B7EC3C1B174",
                    "parentSpanId": "EEE19B7EC3C1B173",
                    "name": "I'm a server span",
                    "startTimeUnixNano": "1544712660000000000",
                    "endTimeUnixNano": "1544712661000000000",
                    "kind": 2,
                    "futureField": {"x": 1},
                    "attributes": [{"key": "my.count", "value": {"intValue": "3"}},
                                   {"key": "ok", "value": {"boolValue": True}}],
                    "status": {"code": 2, "message": "bad"},
                }],
            }],
        }],
    }
    decoded = otlp.decode_otlp_traces(orjson.dumps(body), JS)
    (row,) = decoded.rows
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert row["span_id"] == "eee19b7ec3c1b174"
    assert row["parent_span_id"] == "eee19b7ec3c1b173"
    assert row["time"] == 1544712660000000000 and row["duration_s"] == 1.0
    assert row["state"] == "FAILED" and row["error_message"] == "bad"
    assert row["attrs"] == {"service.name": "svc", "my.count": "3", "ok": "true",
                            "otel.span_kind": "SERVER", "otel.scope": "lib"}


def test_rows_are_accepted_by_the_normalizer() -> None:
    decoded = otlp.decode_otlp_traces(protobuf_body(recorded_spans()), PB)
    result = rows_to_batch(decoded.rows, Stamp.now(node_id="n1"))
    assert result.rejected == [] and result.accepted == 3
    assert set(result.batch.column("kind").to_pylist()) == {"span"}


def test_empty_request_is_valid_and_empty() -> None:
    assert otlp.decode_otlp_traces(b"", PB).rows == []
    assert otlp.decode_otlp_traces(b"{}", JS).rows == []


@pytest.mark.parametrize(
    ("body", "content_type", "status", "reason"),
    [
        (b"this is not protobuf", PB, 400, "invalid OTLP protobuf"),
        (b"{not json", JS, 400, "invalid JSON"),
        (b"[1, 2]", JS, 400, "must be an object"),
        (b'{"resourceSpans": "nope"}', JS, 400, "invalid OTLP JSON"),
        (b"{}", "text/plain", 415, "unsupported Content-Type"),
        (b"{}", None, 415, "unsupported Content-Type"),
    ],
)
def test_undecodable_bodies_raise_with_a_reason(
    body: bytes, content_type: str | None, status: int, reason: str
) -> None:
    with pytest.raises(otlp.OtlpError) as info:
        otlp.decode_otlp_traces(body, content_type)
    assert info.value.status == status
    assert reason in info.value.reason


def test_truncated_protobuf_is_rejected_whole() -> None:
    body = protobuf_body(recorded_spans())
    with pytest.raises(otlp.OtlpError, match="invalid OTLP protobuf"):
        otlp.decode_otlp_traces(body[: len(body) // 2], PB)


def test_spans_with_invalid_ids_are_rejected_and_the_rest_kept() -> None:
    request = encode_spans(recorded_spans())
    spans = request.resource_spans[0].scope_spans[0].spans
    names = {s.name: s for s in spans}
    names["grandchild"].trace_id = bytes(16)
    names["child"].span_id = b"\x01\x02\x03"
    decoded = otlp.decode_otlp_traces(request.SerializeToString(), PB)
    assert [row["name"] for row in decoded.rows] == ["root"]
    assert decoded.rejected_spans == 2
    # Spans are encoded in the order they ended: the grandchild comes first.
    assert decoded.error_message == "span 'grandchild': trace_id must be 16 bytes, not all zero"


def test_json_ids_that_are_not_hex_are_rejected() -> None:
    data = orjson.loads(json_body(recorded_spans()))
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["spanId"] = "zz" * 8
    spans[1]["parentSpanId"] = "abc"
    decoded = otlp.decode_otlp_traces(orjson.dumps(data), JS)
    assert decoded.rejected_spans == 2 and len(decoded.rows) == 1
    assert "must be" in decoded.error_message


def test_protobuf_response_carries_partial_success() -> None:
    body, media = otlp.otlp_response(PB, 2, "span 'x': trace_id must be 16 bytes")
    assert media == PB
    response = trace_service_pb2.ExportTraceServiceResponse.FromString(body)
    assert response.partial_success.rejected_spans == 2
    assert "trace_id" in response.partial_success.error_message
    full, _ = otlp.otlp_response(PB, 0, "")
    assert not trace_service_pb2.ExportTraceServiceResponse.FromString(full).HasField(
        "partial_success")


def test_json_response_carries_partial_success() -> None:
    body, media = otlp.otlp_response(f"{JS}; charset=utf-8", 1, "bad id")
    assert media == JS
    parsed = orjson.loads(body)
    assert parsed == {"partialSuccess": {"rejectedSpans": "1", "errorMessage": "bad id"}}
    assert orjson.loads(otlp.otlp_response(JS, 0, "")[0]) == {}


def test_error_bodies_are_google_rpc_status_in_the_request_encoding() -> None:
    body, media = otlp.otlp_error_body(PB, "invalid OTLP protobuf: truncated")
    status = status_pb2.Status.FromString(body)
    assert media == PB and status.code == 3 and status.message.startswith("invalid OTLP")
    body, media = otlp.otlp_error_body(JS, "x" * 300)
    assert media == JS and orjson.loads(body) == {"code": 3, "message": "x" * 300}
    body, media = otlp.otlp_error_body("text/html", "no")  # OTLP's default encoding then
    assert media == PB and status_pb2.Status.FromString(body).message == "no"


def test_missing_otlp_support_answers_501(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_proto(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry.proto"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_proto)
    with pytest.raises(otlp.OtlpError) as info:
        otlp.decode_otlp_traces(b"", PB)
    assert info.value.status == 501 and "pip install 'evagg[otel]'" in str(info.value)


def test_a_json_body_without_protobuf_installed_answers_501_not_500(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_protobuf(name: str) -> Any:
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")

    monkeypatch.setattr(otlp.importlib, "import_module", no_protobuf)
    with pytest.raises(otlp.OtlpError) as info:
        otlp.decode_otlp_traces(b'{"resourceSpans": []}', JS)
    assert info.value.status == 501 and "pip install 'evagg[otel]'" in str(info.value)


# ---- aggregator.cli.export_traces: Parquet spans -> OTLP JSON -----------------------------


def write_lake(root: Any, rows: list[dict[str, Any]], name: str = "part-0") -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    batch = rows_to_batch(rows, Stamp.now(node_id="n1", host="h1", pid=42)).batch
    folder = root / "date=2026-11-29" / "hour=12" / "node=n1"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_batches([batch]), folder / f"{name}.parquet")


def exported(path: Any) -> otlp.OtlpDecoded:
    return otlp.decode_otlp_traces(path.read_bytes(), JS)


def test_export_writes_each_span_once_with_links_errors_and_columns(tmp_path: Any) -> None:
    from aggregator.cli.export_traces import export_traces

    rows = otlp.decode_otlp_traces(protobuf_body(recorded_spans()), PB).rows
    write_lake(tmp_path / "lake", rows)
    write_lake(tmp_path / "lake", rows[:1], name="resent")  # a resent batch
    write_lake(tmp_path / "lake", [{"kind": "op", "name": "no-trace", "state": "FINISHED"}],
               name="other")
    out = tmp_path / "out" / "trace.json"
    assert export_traces(str(tmp_path / "lake"), out=out) == 3
    decoded = exported(out)
    assert decoded.rejected_spans == 0
    again = by_name(decoded.rows)
    original = by_name(rows)
    for name in ("root", "child", "grandchild"):
        assert again[name]["span_id"] == original[name]["span_id"]
        assert again[name].get("parent_span_id") == original[name].get("parent_span_id")
    assert again["child"]["state"] == "FAILED"
    assert again["child"]["error_type"] == "ValueError"
    assert "raise ValueError" in again["child"]["stack_trace"]
    assert again["root"]["step"] == 12 and again["root"]["run_id"] == "run-7"
    assert again["root"]["attrs"]["evagg.node_id"] == "n1"
    assert again["root"]["attrs"]["process.pid"] == "42"
    document = orjson.loads(out.read_bytes())
    (resource,) = document["resourceSpans"]
    assert resource["resource"]["attributes"] == [
        {"key": "service.name", "value": {"stringValue": "trainer"}}]


def test_export_filters_by_trace_and_time(tmp_path: Any) -> None:
    from datetime import UTC, datetime

    from aggregator.cli.export_traces import NothingToExport, export_traces

    first = otlp.decode_otlp_traces(protobuf_body(recorded_spans()), PB).rows
    second = otlp.decode_otlp_traces(protobuf_body(recorded_spans()), PB).rows
    write_lake(tmp_path, first + second)
    out = tmp_path / "t.json"
    assert export_traces(str(tmp_path), trace_id=second[0]["trace_id"].upper(), out=out) == 3
    assert {r["trace_id"] for r in exported(out).rows} == {second[0]["trace_id"]}
    later = datetime.fromtimestamp(max(r["time"] for r in first + second) / 1e9 + 1, UTC)
    out.unlink()
    with pytest.raises(NothingToExport, match=r"no span since .* nothing was written"):
        export_traces(str(tmp_path), since=later, out=out)
    assert not out.exists()


def test_export_of_a_place_without_parquet_says_so(tmp_path: Any) -> None:
    from aggregator.cli.export_traces import export_traces

    with pytest.raises(ValueError, match="cannot read spans from"):
        export_traces(str(tmp_path / "empty"), out=tmp_path / "x.json")


def test_export_reads_s3(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from aggregator.cli.export_traces import export_traces
    from tests.sinks.moto_server import MotoS3, aws_env

    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    s3 = MotoS3().start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
        bucket = s3.create_bucket()
        rows = otlp.decode_otlp_traces(protobuf_body(recorded_spans()), PB).rows
        write_lake(tmp_path, rows)
        for path in tmp_path.rglob("*.parquet"):
            key = f"evagg/{path.relative_to(tmp_path)}"
            s3.client().upload_file(str(path), bucket, key)
        out = tmp_path / "s3.json"
        assert export_traces(f"s3://{bucket}/evagg/", out=out) == 3
        assert sorted(by_name(exported(out).rows)) == ["child", "grandchild", "root"]
    finally:
        s3.stop()


@pytest.mark.parametrize(("value", "step"), [(7, 7), (7.0, 7), ("7", 7), (2.5, None),
                                              ("x", None), (True, None)])
def test_a_step_attribute_fills_the_step_column_when_it_is_a_whole_number(
        value: object, step: int | None) -> None:
    from emitters.integrations.otel_rows import span_event

    row = span_event(name="epoch", trace_id="ab" * 16, span_id="cd" * 8, parent_span_id=None,
                     start_ns=1, end_ns=2, failed=False, status_message="", span_kind="INTERNAL",
                     scope="", attributes={"evagg.step": value}, resource={})
    assert row.get("step") == step
    assert "evagg.step" in row["attrs"]  # the attribute itself is kept as sent
