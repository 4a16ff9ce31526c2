"""OTLP/HTTP trace requests -> evagg span rows, and the responses OTLP exporters expect.

Follows the OTLP/HTTP spec: protobuf (`application/x-protobuf`) or JSON
(`application/json`, where trace and span ids are hex strings, not base64, and unknown
fields are ignored); a gzip or deflate body is inflated by the route first
(aggregator/ingest/bodies.py). A body that cannot be decoded at all raises
`OtlpError` (400, or 415 for an unsupported content type) and nothing of it
is stored. Spans with invalid ids or without a usable end time are rejected one by one
and reported through `partial_success`, the rest are kept; attribute values longer than
`VALUE_LIMIT` characters are cut, as the socket exporter cuts them. The rows go to
`aggregator.decode.normalize.rows_to_batch`.

The opentelemetry-proto messages are imported lazily so the agent starts without them;
then every OTLP request is answered 501.
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import orjson

from emitters.integrations.otel_rows import (
    CUT_KEY,
    EXCEPTION_EVENT,
    end_problem,
    events_text,
    link_item,
    resource_text,
    span_event,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8
_STATUS_ERROR = 2
_STATUS_OK = 1
_INVALID_ARGUMENT = 3  # google.rpc.Code
_UNAVAILABLE = 14
_BAD_ID = base64.b64encode(b"\0").decode()  # decodes, then fails the length check
_ID_KEYS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")


NO_OTLP = ("this agent cannot read OTLP: install its OpenTelemetry extra "
           "(pip install 'evagg[otel]') and restart it")


class OtlpError(ValueError):
    """A request that cannot be decoded at all; `status` is the HTTP status to answer."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(slots=True)
class OtlpDecoded:
    rows: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (span index, reason)
    cut_attributes: int = 0  # attribute values cut to VALUE_LIMIT characters

    @property
    def rejected_spans(self) -> int:
        return len(self.rejected)

    @property
    def error_message(self) -> str:
        return self.rejected[0][1] if self.rejected else ""


def media_type(content_type: str | None) -> str:
    """The OTLP encoding named by a Content-Type header, or OtlpError(415)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        raise OtlpError(
            f"unsupported Content-Type {content_type!r}: use {PROTOBUF} or {JSON}", 415
        )
    return media


def decode_otlp_traces(body: bytes, content_type: str | None) -> OtlpDecoded:
    """The spans of a request body, inflated already (the route does: ingest/bodies.py)."""
    media = media_type(content_type)
    request = _parse_json(body) if media == JSON else _parse_protobuf(body)
    return _rows(request)


def readable() -> bool:
    """Whether OTLP's messages can be imported (found, not imported: the start stays quick)."""
    try:
        return importlib.util.find_spec("opentelemetry.proto.collector.trace.v1") is not None
    except ImportError:  # a parent package that is no package
        return False


def _messages() -> Any:
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError:
        raise OtlpError(NO_OTLP, 501) from None
    return trace_service_pb2


def _protobuf(module: str) -> Any:
    # Through importlib: google.protobuf ships no type stubs.
    try:
        return importlib.import_module(f"google.protobuf.{module}")
    except ImportError:
        raise OtlpError(NO_OTLP, 501) from None


def _parse_protobuf(raw: bytes) -> Any:
    request = _messages().ExportTraceServiceRequest()
    try:
        request.ParseFromString(raw)
    except _protobuf("message").DecodeError as exc:
        raise OtlpError(f"invalid OTLP protobuf: {exc}") from None
    return request


def _parse_json(raw: bytes) -> Any:
    json_format = _protobuf("json_format")
    request = _messages().ExportTraceServiceRequest()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise OtlpError("an OTLP JSON request must be an object")
    _hex_ids_to_base64(data)
    try:
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise OtlpError(f"invalid OTLP JSON: {exc}") from None
    return request


def _hex_ids_to_base64(data: dict[str, Any]) -> None:
    """OTLP JSON carries ids as hex; protobuf's JSON mapping wants base64 for bytes."""
    for resource_spans in _items(data, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            for span in _items(scope_spans, "spans"):
                _convert_ids(span)
                for link in _items(span, "links"):
                    _convert_ids(link)


def _items(parent: Any, *keys: str) -> list[Any]:
    if not isinstance(parent, dict):
        return []
    for key in keys:
        value = parent.get(key)
        if isinstance(value, list):
            return value
    return []


def _convert_ids(obj: Any) -> None:
    if not isinstance(obj, dict):
        return
    for key in _ID_KEYS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                obj[key] = _BAD_ID


def _rows(request: Any) -> OtlpDecoded:
    out = OtlpDecoded()
    for resource_spans in request.resource_spans:
        resource = resource_text(_attributes(resource_spans.resource.attributes))
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                reason = _invalid_ids(span) or end_problem(
                    span.name or "(unnamed)", span.start_time_unix_nano, span.end_time_unix_nano)
                if reason:
                    out.rejected.append((len(out.rows) + len(out.rejected), reason))
                    continue
                row = _span_row(span, resource, scope)
                cut = row["attrs"].get(CUT_KEY)
                if cut is not None:
                    out.cut_attributes += len(orjson.loads(cut))
                out.rows.append(row)
    return out


def _invalid_ids(span: Any) -> str:
    name = span.name or "(unnamed)"
    if len(span.trace_id) != _TRACE_ID_BYTES or not any(span.trace_id):
        return f"span {name!r}: trace_id must be 16 bytes, not all zero"
    if len(span.span_id) != _SPAN_ID_BYTES or not any(span.span_id):
        return f"span {name!r}: span_id must be 8 bytes, not all zero"
    if span.parent_span_id and len(span.parent_span_id) != _SPAN_ID_BYTES:
        return f"span {name!r}: parent_span_id must be empty or 8 bytes"
    return ""


def _span_row(span: Any, resource: dict[str, str], scope: str) -> dict[str, Any]:
    exception = None
    events = [(event.name, event.time_unix_nano, _attributes(event.attributes))
              for event in span.events]
    for name, _, attributes in events:
        if name == EXCEPTION_EVENT:
            exception = attributes
    parent = span.parent_span_id
    return span_event(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=parent.hex() if parent and any(parent) else None,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        failed=span.status.code == _STATUS_ERROR,
        ok=span.status.code == _STATUS_OK,
        status_message=span.status.message,
        span_kind=_span_kind(span.kind),
        scope=scope,
        attributes=_attributes(span.attributes),
        resource=resource,
        exception=exception,
        links=[link_item(link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
               for link in span.links],
        events=events_text(events) if events else None,
        dropped=(span.dropped_attributes_count, span.dropped_events_count,
                 span.dropped_links_count),
    )


_SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")


def _span_kind(kind: int) -> str:
    # The SDK's names (SpanKind.name), so the socket exporter stores the same text.
    return _SPAN_KINDS[kind] if 0 <= kind < len(_SPAN_KINDS) else str(kind)


def _attributes(key_values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in key_values:
        value = _any_value(kv.value)
        if value is not None:
            out[kv.key] = value
    return out


def _any_value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, which)


def otlp_response(content_type: str | None, rejected_spans: int, message: str) -> tuple[bytes, str]:
    """ExportTraceServiceResponse (with partial_success when anything was rejected)."""
    media = _response_media(content_type)
    response = _messages().ExportTraceServiceResponse()
    if rejected_spans or message:
        response.partial_success.rejected_spans = rejected_spans
        response.partial_success.error_message = message
    if media == JSON:
        return _protobuf("json_format").MessageToJson(response, indent=None).encode(), JSON
    return response.SerializeToString(), PROTOBUF


def otlp_error_body(content_type: str | None, reason: str,
                    http_status: int = 400) -> tuple[bytes, str]:
    """A google.rpc.Status body for a 4xx/5xx answer, in the request's encoding (JSON or
    protobuf; protobuf when the request named neither): UNAVAILABLE for a 503 (send again
    later), else INVALID_ARGUMENT."""
    code = _UNAVAILABLE if http_status == 503 else _INVALID_ARGUMENT
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == JSON:
        return orjson.dumps({"code": code, "message": reason}), JSON
    # Protobuf for any other type too: OTLP's default encoding, what its exporters parse.
    return _status_protobuf(code, reason), PROTOBUF


def _response_media(content_type: str | None) -> str:
    try:
        return media_type(content_type)
    except OtlpError:
        return PROTOBUF


def _status_protobuf(code: int, message: str) -> bytes:
    # google.rpc.Status is two fields; encoded by hand to need no googleapis protos.
    text = message.encode("utf-8", "replace")
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)
