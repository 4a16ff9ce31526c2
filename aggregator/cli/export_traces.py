"""Spans in the Parquet store -> one OTLP JSON file (ExportTraceServiceRequest).

Jaeger's UI loads such a file ("Search" -> "Upload"), and so does any OTLP tool.
Every event with a trace_id, a span_id and a terminal state (FINISHED or FAILED) is a
span: OTel spans, and evagg ops or tasks that carried trace context. A span seen twice
(a resent batch) is written once. Resources are grouped by `service.name`, falling back
to the event's source. DuckDB reads the Parquet; s3:// goes through `dashboard.lake.s3`
(httpfs from its pip package, credentials from boto3's chain).

What comes back differs from what was sent in two ways, both from how evagg stores a
span: attribute values are strings (evagg keeps attributes as text; `process.pid` (the
pid column, or an OTLP resource's) and `evagg.step`, which have columns, are ints), and
start and end times are whole microseconds (DuckDB reads the time column at that
precision; the end is the start plus the duration, rounded alike, so a span never ends
before it starts).
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from sinks.locations import is_s3_url
from sinks.parquet.layout import EVENT_GLOB

_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "state", "kind", "source",
            "duration_s", "error_type", "error_message", "stack_trace", "attrs",
            "run_id", "job_id", "node_id", "host", "pid", "step")
_SPAN_KINDS = {"UNSPECIFIED": 0, "INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4,
               "CONSUMER": 5}
_EVENTS = "otel.events"  # emitters.integrations.otel_rows.EVENTS_KEY
_EXCEPTION_MESSAGE = "exception.message"  # otel_rows.EXCEPTION_MESSAGE_KEY
_LINKS = "otel.links"  # ["<trace id>-<span id>" or {"id": that, "attributes": {...}}, ...]
_LINK = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{16})$")
# What the sender's span limits dropped (emitters.integrations.otel_rows.DROPPED_KEYS)
_DROPPED = (("otel.dropped_attributes", "droppedAttributesCount"),
            ("otel.dropped_events", "droppedEventsCount"),
            ("otel.dropped_links", "droppedLinksCount"))
_INTERNAL_ATTRS = frozenset({"otel.span_kind", "otel.scope", "service.name"})
_COLUMN_ATTRS = (("run_id", "evagg.run_id"), ("job_id", "evagg.job_id"),
                 ("node_id", "evagg.node_id"), ("host", "host.name"),
                 ("kind", "evagg.kind"), ("source", "evagg.source"))
_STATUS_ERROR = 2
_STATUS_OK = 1
_STATUS = "otel.status_code"  # otel_rows.STATUS_KEY: "OK" where the span's status was OK
_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")


class NothingToExport(ValueError):
    """No span matched: nothing is written (an empty file would look like a success)."""


def checked_trace_id(text: str) -> str:
    """A trace id as stored (32 lower-case hex digits), or ValueError saying what one is."""
    value = text.strip()
    if not _TRACE_ID.match(value) or not value.strip("0"):
        raise ValueError(f"{text[:80]!r} is not a trace id: one is 32 hex digits, not all "
                         "zero, as in the trace_id column or a traceparent's second part")
    return value.lower()


def export_traces(
    data: str,
    *,
    trace_id: str | None = None,
    since: datetime | None = None,
    out: Path,
    max_spans: int = 1_000_000,
) -> int:
    """Write the spans under `data` (a local directory or s3:// URL) to `out`; returns the
    count. NothingToExport (and no file) when no span matches."""
    if trace_id is not None:
        trace_id = checked_trace_id(trace_id)
    rows = read_spans(data, trace_id=trace_id, since=since, max_spans=max_spans)
    if not rows:
        raise NothingToExport(_nothing(data, trace_id, since))
    document = otlp_json(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(orjson.dumps(document))
    tmp.replace(out)
    return len(rows)


def read_spans(
    data: str, *, trace_id: str | None, since: datetime | None, max_spans: int
) -> list[dict[str, Any]]:
    import duckdb

    connection = _connect(data)
    where = ["trace_id IS NOT NULL", "span_id IS NOT NULL", "state IN ('FINISHED', 'FAILED')"]
    params: list[Any] = []
    if trace_id:
        where.append("trace_id = ?")
        params.append(trace_id.lower())
    if since is not None:
        where.append("time >= ?")
        params.append(since if since.tzinfo else since.replace(tzinfo=UTC))
    sql = f"""
        SELECT {", ".join(_COLUMNS)}, epoch_ns(time) AS time_ns
        FROM read_parquet(?, hive_partitioning = true, union_by_name = true)
        WHERE {" AND ".join(where)}
        QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received DESC) = 1
        ORDER BY time
        LIMIT {int(max_spans)}
    """
    try:
        cursor = connection.execute(sql, [_glob(data), *params])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    except duckdb.Error as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot read spans from {data}: {reason}") from None


def _nothing(data: str, trace_id: str | None, since: datetime | None) -> str:
    wanted = "".join((f" of trace {trace_id}" if trace_id else "",
                      f" since {since.isoformat(timespec='seconds')}" if since else ""))
    return (f"no span{wanted} under {data}, so nothing was written: check the id "
            "(evagg query sql \"SELECT DISTINCT trace_id FROM events\") or the time")


def _glob(data: str) -> str:
    return f"{data.rstrip('/')}/{EVENT_GLOB}"  # the layout's, not `**`


def _connect(data: str) -> Any:
    import duckdb

    connection = duckdb.connect()
    if is_s3_url(data):
        from dashboard.lake.s3 import S3Settings, load_httpfs

        load_httpfs(connection, S3Settings.resolve())
    return connection


def otlp_json(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An ExportTraceServiceRequest in OTLP JSON (hex ids, integer enums, string int64s)."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        attrs = row["attrs"] or {}
        service = attrs.get("service.name") or row["source"] or "evagg"
        grouped[service][attrs.get("otel.scope") or row["source"] or "evagg"].append(_span(row))
    return {"resourceSpans": [
        {"resource": {"attributes": [_kv("service.name", service)]},
         "scopeSpans": [{"scope": {"name": scope}, "spans": spans}
                        for scope, spans in scopes.items()]}
        for service, scopes in grouped.items()
    ]}


def _span(row: dict[str, Any]) -> dict[str, Any]:
    attrs = dict(row["attrs"] or {})
    start = int(row["time_ns"])  # whole microseconds: DuckDB's precision for the column
    end = start + round((row["duration_s"] or 0.0) * 1e6) * 1000
    events = _stored_events(attrs.get(_EVENTS))
    if events:  # back as the span's events, not as a text attribute
        del attrs[_EVENTS]
    links = _stored_links(attrs.get(_LINKS))
    if links:  # back as the span's links, which Jaeger draws as references
        del attrs[_LINKS]
    dropped = {field: int(attrs.pop(key)) for key, field in _DROPPED
               if attrs.get(key, "").isdigit()}
    status_ok = attrs.pop(_STATUS, None) == "OK"  # set OK, not left unset
    has_exception = bool(row["error_type"] or row["stack_trace"])
    exception_message = attrs.pop(_EXCEPTION_MESSAGE, None) if has_exception else None
    span: dict[str, Any] = {
        "traceId": row["trace_id"],
        "spanId": row["span_id"],
        "name": row["name"] or row["kind"],
        "kind": _SPAN_KINDS.get(attrs.get("otel.span_kind", ""), 1),
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": _attributes(row, attrs),
    }
    if row["parent_span_id"]:
        span["parentSpanId"] = row["parent_span_id"]
    if row["state"] == "FAILED":
        span["status"] = {"code": _STATUS_ERROR, "message": row["error_message"] or ""}
    elif status_ok:
        span["status"] = {"code": _STATUS_OK}
    if has_exception:
        events.append(_exception_event(row, end, exception_message))
    if events:
        span["events"] = events
    if links:
        span["links"] = links
    span.update(dropped)
    return span


def _stored_list(text: str | None) -> list[Any]:
    """A list the span's attrs hold as JSON text; none where the text is not one (a list
    cut at the attribute value limit no longer parses, or an attribute of the span's own
    by that name): it then stays an attribute only."""
    if not text:
        return []
    try:
        stored = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    return stored if isinstance(stored, list) else []


def _stored_links(text: str | None) -> list[dict[str, Any]]:
    """The span's links from attrs['otel.links'], each with its own attributes where it
    had any (otel_rows.link_item); none unless every one reads."""
    links = [_stored_link(item) for item in _stored_list(text)]
    return [link for link in links if link] if all(links) else []


def _stored_link(item: Any) -> dict[str, Any] | None:
    ident: Any = item
    attributes: Any = {}
    if isinstance(item, dict):
        ident, attributes = item.get("id"), item.get("attributes")
    found = _LINK.match(ident) if isinstance(ident, str) else None
    if found is None or not isinstance(attributes, dict):
        return None
    link: dict[str, Any] = {"traceId": found.group(1), "spanId": found.group(2)}
    if attributes:
        link["attributes"] = [_kv(k, v) for k, v in attributes.items()]
    return link


def _stored_events(text: str | None) -> list[dict[str, Any]]:
    """The span's events as stored in attrs['otel.events']."""
    return [{"timeUnixNano": str(event.get("time_unix_nano") or 0),
             "name": str(event.get("name") or ""),
             "attributes": [_kv(k, v) for k, v in (event.get("attributes") or {}).items()]}
            for event in _stored_list(text) if isinstance(event, dict)]


def _attributes(row: dict[str, Any], attrs: dict[str, str]) -> list[dict[str, Any]]:
    values: dict[str, dict[str, str]] = {
        k: {"stringValue": v} for k, v in attrs.items() if k not in _INTERNAL_ATTRS}
    for column, key in _COLUMN_ATTRS:
        if row[column]:
            values.setdefault(key, {"stringValue": str(row[column])})
    for column, key in (("pid", "process.pid"), ("step", "evagg.step")):
        if row[column] is not None:
            values[key] = {"intValue": str(row[column])}
        elif attrs.get(key, "").isdigit():  # an OTLP span's pid: its resource's, as text
            values[key] = {"intValue": attrs[key]}
    return [{"key": k, "value": v} for k, v in sorted(values.items())]


def _exception_event(row: dict[str, Any], end_ns: int, message: str | None) -> dict[str, Any]:
    # the exception's own message where the status message took error_message
    fields = (("exception.type", row["error_type"]),
              ("exception.message", message or row["error_message"]),
              ("exception.stacktrace", row["stack_trace"]))
    return {"timeUnixNano": str(end_ns), "name": "exception",
            "attributes": [_kv(k, v) for k, v in fields if v]}


def _kv(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": str(value)}}
