"""The `span` event row: one mapping from span fields to evagg columns for every span path.

`span_event` serves the agent's OTLP decoder and the socket exporter's generic path
(`readable_span_event`), so both store identical rows; `emitters.integrations.otel_fast` builds the
same rows faster for the common SDK spans and leans on the helpers here for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

RUN_ID_KEYS = ("evagg.run_id", "run_id")
JOB_ID_KEYS = ("evagg.job_id", "job_id", "ray.job_id")
STEP_KEYS = ("evagg.step", "step")
EXCEPTION_EVENT = "exception"
# A span whose status is OK (set by its code, not left unset) says so here: the state
# column is FINISHED for both, and Jaeger and Tempo tell them apart.
STATUS_KEY = "otel.status_code"
# A failed span's last exception message where its status message is another text
EXCEPTION_MESSAGE_KEY = "exception.message"
SPECIAL_KEYS = frozenset((*RUN_ID_KEYS, *JOB_ID_KEYS, *STEP_KEYS, "error.type"))
NOTHING: Mapping[str, Any] = {}
VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}  # UUID variant digit
# The OTel SDK's attribute value length limit, applied by evagg on both span paths: an
# attribute's stored text is cut to this many characters and its key listed in CUT_KEY.
# 32 Ki characters keep a span with a few cut values under the socket's 1 MiB event cap.
VALUE_LIMIT = 32_768
CUT_KEY = "evagg.cut_attributes"
# The span's events, as JSON text: every event but the last `exception` (whose fields are
# the error columns), each {"name", "time_unix_nano", "attributes"} with values as text.
EVENTS_KEY = "otel.events"
# The span's links, a JSON list of link_item's items
LINKS_KEY = "otel.links"
Link = str | dict[str, Any]
# How many attributes, events and links the SDK's span limits (128 each by default)
# dropped before the span was sent, as OTLP reports them: a span cut short says so.
DROPPED_KEYS = ("otel.dropped_attributes", "otel.dropped_events", "otel.dropped_links")
# Ray colours its error texts for terminals; the escapes are noise in a table.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class UnendedSpan(ValueError):
    """A span without a usable end time: stored, it would read as finished in no time."""


def end_problem(name: str, start_ns: int, end_ns: int | None) -> str:
    """Why a span's times cannot make a row ("" when they can)."""
    if not start_ns or start_ns < 0:
        return f"span {name!r}: startTimeUnixNano is missing or zero"
    if not end_ns:
        return f"span {name!r}: endTimeUnixNano is missing or zero: send spans once they end"
    if end_ns < start_ns:
        return f"span {name!r}: endTimeUnixNano is before startTimeUnixNano"
    return ""


def cut_values(attrs: dict[str, Any]) -> int:
    """Cut every text in `attrs` longer than VALUE_LIMIT; list the cut keys under CUT_KEY
    (sorted JSON text); returns how many were cut."""
    cut = [key for key, value in attrs.items()
           if type(value) is str and len(value) > VALUE_LIMIT]
    for key in cut:
        attrs[key] = attrs[key][:VALUE_LIMIT]
    if cut:
        attrs[CUT_KEY] = orjson.dumps(sorted(cut)).decode()
    return len(cut)


def clean_error_text(text: str) -> str:
    """An error message or stack trace as stored: terminal colours out, at most VALUE_LIMIT."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text[:VALUE_LIMIT]


def attr_text(value: Any) -> str:
    """An attribute value as the text evagg stores (both span paths use this rule)."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        return repr(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def resource_text(attributes: Mapping[str, Any]) -> dict[str, str]:
    """Resource attributes as attrs text, less the SDK's constant telemetry.sdk.* labels."""
    return {k: attr_text(v) for k, v in attributes.items()
            if v is not None and not k.startswith("telemetry.sdk.")}


def events_text(events: Iterable[tuple[str, int, Mapping[str, Any] | None]]) -> str | None:
    """The EVENTS_KEY text of (name, time in ns, attributes) events, None for no event to
    keep: the last `exception` event is left out, its fields fill the error columns."""
    listed = list(events)
    last_exception = max((i for i, event in enumerate(listed) if event[0] == EXCEPTION_EVENT),
                         default=-1)
    kept = []
    for index, (name, time_ns, attributes) in enumerate(listed):
        if index == last_exception:
            continue
        item: dict[str, Any] = {"name": name, "time_unix_nano": time_ns}
        if attributes:
            item["attributes"] = {k: attr_text(v) for k, v in attributes.items()
                                  if v is not None}
        kept.append(item)
    return orjson.dumps(kept).decode() if kept else None


def add_dropped(attrs: dict[str, Any], attributes: int, events: int, links: int) -> None:
    """The DROPPED_KEYS counts that are not zero, as text."""
    for key, count in zip(DROPPED_KEYS, (attributes, events, links), strict=True):
        if count:
            attrs[key] = str(count)


def sdk_events(events: Iterable[Any]) -> list[tuple[str, int, Mapping[str, Any] | None]]:
    """OTel SDK Events as events_text's tuples."""
    return [(event.name, event.timestamp, event.attributes) for event in events]


def span_event_id(trace_id: str, span_id: str, start_ns: int) -> str:
    """A UUIDv7-shaped id fixed by the span, so a resent span dedupes on `event_id`.

    Its 74 random bits are the trace id's last 12 (random by W3C rule) and 62 of the span
    id's; a hash would cost twice as much per span.
    """
    h = f"{max(start_ns, 0) // 1_000_000:012x}"
    return f"{h[:8]}-{h[8:12]}-7{trace_id[-3:]}-{VARIANT[span_id[0]]}{span_id[1:4]}-{span_id[4:]}"


def span_event(
    *, name: str, trace_id: str, span_id: str, parent_span_id: str | None, start_ns: int,
    end_ns: int, failed: bool, status_message: str, span_kind: str, scope: str,
    attributes: Mapping[str, Any], resource: Mapping[str, str],
    exception: Mapping[str, Any] | None = None, links: Iterable[Link] = (),
    events: str | None = None, dropped: tuple[int, int, int] = (0, 0, 0), ok: bool = False,
) -> dict[str, Any]:
    """One evagg `span` event row from plain span fields (ids as lower-case hex; the
    resource already as text, see `resource_text`; `events` as `events_text` makes it)."""
    attrs = dict(resource)
    for key, value in attributes.items():
        if value is not None:
            attrs[key] = value if type(value) is str else attr_text(value)
    if events:
        attrs[EVENTS_KEY] = events
    cut_values(attrs)
    if ok:
        attrs[STATUS_KEY] = "OK"
    if span_kind != "INTERNAL":  # the default; an export without it reads as INTERNAL
        attrs["otel.span_kind"] = span_kind
    if scope:
        attrs["otel.scope"] = scope
    link_list = list(links)
    if link_list:
        attrs[LINKS_KEY] = attr_text(link_list)
    if any(dropped):
        add_dropped(attrs, *dropped)
    row: dict[str, Any] = {
        "event_id": span_event_id(trace_id, span_id, start_ns), "kind": "span",
        "source": "otel", "name": name, "state": "FAILED" if failed else "FINISHED",
        "trace_id": trace_id, "span_id": span_id, "attrs": attrs,
    }
    if start_ns > 0:
        row["time"] = start_ns
        if end_ns >= start_ns:
            row["duration_s"] = (end_ns - start_ns) / 1e9
    if parent_span_id:
        row["parent_span_id"] = parent_span_id
    # Most spans carry none of the special keys: look them up only when some are there.
    special = attributes if not SPECIAL_KEYS.isdisjoint(attributes) else NOTHING
    add_special_columns(row, special, resource)
    if failed or exception:
        add_error(row, failed, status_message, special, exception or {})
    return row


def add_special_columns(row: dict[str, Any], special: Mapping[str, Any],
                        resource: Mapping[str, str]) -> None:
    """run_id and job_id from the attributes, else the resource; step from the attributes."""
    for column, keys in (("run_id", RUN_ID_KEYS), ("job_id", JOB_ID_KEYS)):
        value = _first(keys, special, resource)
        if value is not None:
            row[column] = attr_text(value)
    step = _step(_first(STEP_KEYS, special))
    if step is not None:
        row["step"] = step


def _step(value: Any) -> int | None:
    """A step attribute as the step column: an int, or a whole number an SDK or a
    library sent as a float or as text (3.0, "3"); anything else stays an attribute only."""
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if type(value) is str and value.strip().lstrip("-").isdigit() and len(value) < 19:
        return int(value)
    return None


def _first(keys: tuple[str, ...], *sources: Mapping[str, Any]) -> Any:
    for source in sources:
        for key in keys:
            value = source.get(key)
            if value is not None and value != "":
                return value
    return None


def add_error(row: dict[str, Any], failed: bool, status_message: str,
              attributes: Mapping[str, Any], exc: Mapping[str, Any]) -> None:
    exception_message = exc.get("exception.message")
    by_status = failed and status_message
    fields = {
        "error_type": exc.get("exception.type") or attributes.get("error.type"),
        "error_message": status_message if by_status else exception_message,
        "stack_trace": exc.get("exception.stacktrace"),
    }
    row.update((k, clean_error_text(attr_text(v))) for k, v in fields.items() if v)
    if by_status and exception_message and attr_text(exception_message) != status_message:
        # The status message took error_message: without this the exception's own
        # message would be lost, and an export would give the status's in its place.
        row.setdefault("attrs", {})[EXCEPTION_MESSAGE_KEY] = clean_error_text(
            attr_text(exception_message))


def link_item(trace_id: str, span_id: str, attributes: Mapping[str, Any] | None) -> Link:
    """One link as LINKS_KEY stores it: "<trace id>-<span id>" (hex), or with attributes
    of its own (why the span links there: a message id, a batch index) {"id": that,
    "attributes": {key: text}}, the values as a span's own are kept (attr_text)."""
    link = f"{trace_id}-{span_id}"
    kept = {k: attr_text(v) for k, v in (attributes or {}).items() if v is not None}
    return {"id": link, "attributes": kept} if kept else link


def sdk_links(links: Iterable[Any]) -> list[Link]:
    """OTel SDK Links as LINKS_KEY's items."""
    return [link_item(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}",
                      link.attributes) for link in links]


def readable_span_event(span: Any, resource: Mapping[str, str]) -> dict[str, Any]:
    """The event row of a finished OTel SDK ReadableSpan (any span-like object); raises
    UnendedSpan for one without an end, or ending before it starts."""
    # The public properties copy (events, links) or wrap (attributes) on every access;
    # read the fields they wrap where present.
    events = getattr(span, "_events", None)
    links = getattr(span, "_links", None)
    attributes = getattr(span, "_attributes", _MISSING)
    exception = None
    events = span.events if events is None else events
    for event in events:
        if event.name == EXCEPTION_EVENT:
            exception = event.attributes
    parent = span.parent
    scope = span.instrumentation_scope
    start = span.start_time or 0
    problem = end_problem(span.name, start, span.end_time)
    if problem:
        raise UnendedSpan(problem)
    context = span.context
    return span_event(
        name=span.name,
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
        start_ns=start,
        end_ns=span.end_time,
        failed=span.status.status_code.value == STATUS_ERROR,
        ok=span.status.status_code.value == STATUS_OK,
        status_message=span.status.description or "",
        span_kind=span.kind.name,
        scope=scope.name if scope is not None else "",
        attributes=dict(span.attributes if attributes is _MISSING else attributes or {}),
        resource=resource,
        exception=exception,
        links=sdk_links(span.links if links is None else links),
        events=events_text(sdk_events(events)) if events else None,
        dropped=(getattr(span, "dropped_attributes", 0), getattr(span, "dropped_events", 0),
                 getattr(span, "dropped_links", 0)),
    )


_MISSING: Any = object()
STATUS_ERROR = 2  # opentelemetry.trace.StatusCode.ERROR
STATUS_OK = 1
