"""Span rows for the common SDK span, read once with the cheapest accessors.

`SpanRows.convert` turns a batch of finished OTel SDK ReadableSpans into the very rows
that `otel_rows.readable_span_event` and then the emitter's per-field checks would make
of them (the exporter hands them to `Emitter.enqueue_built`, which skips those checks).
It reads the SDK's own fields instead of the copying properties; keeps per resource and
scope their attributes as text and the run and job ids, per trace its hex id, per parent
its hex id; and formats ids as bytes (half the cost of an f-string with a format spec;
an id too wide raises, and so takes the generic path). Any span it cannot vouch for
(another span class, a plain-dict attribute mapping, a start time outside int64, a None
attribute, a step out of range, a non-text name or scope) goes back to the caller for
the generic path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from emitters.integrations.otel_rows import (
    EVENTS_KEY,
    EXCEPTION_EVENT,
    JOB_ID_KEYS,
    LINKS_KEY,
    NOTHING,
    RUN_ID_KEYS,
    SPECIAL_KEYS,
    STATUS_KEY,
    STEP_KEYS,
    VALUE_LIMIT,
    VARIANT,
    add_dropped,
    add_error,
    add_special_columns,
    attr_text,
    cut_values,
    events_text,
    resource_text,
    sdk_events,
    sdk_links,
)

_INT64 = 2**63
_CACHE_LIMIT = 1024  # trace ids and parent ids kept, each (about 250 KB at most)


class _Base:
    """What every span of one Resource and one instrumentation scope shares."""

    __slots__ = ("attrs", "columns", "long_values", "resource", "resource_attrs", "scope",
                 "scope_name")

    def __init__(self, resource: Any, scope: Any) -> None:
        # Held so that their id()s cannot be reused while cached.
        self.resource = resource
        self.scope = scope
        self.resource_attrs = resource_text(resource.attributes)
        if not all(type(k) is str for k in self.resource_attrs):
            raise TypeError("resource attribute keys must be strings")
        self.long_values = any(len(v) > VALUE_LIMIT for v in self.resource_attrs.values())
        self.columns: dict[str, Any] = {}
        add_special_columns(self.columns, NOTHING, self.resource_attrs)
        name = scope.name if scope is not None else ""
        if type(name) is not str:
            raise TypeError("instrumentation scope names must be strings")
        self.scope_name = name
        # Room for the scope's key from the start; span_event sets it after the attributes.
        self.attrs = {**self.resource_attrs, "otel.scope": name} if name else self.resource_attrs


class SpanRows:
    """Converts SDK spans to finished event rows; one per exporter (it holds caches)."""

    def __init__(self) -> None:
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util import BoundedList
        from opentelemetry.trace import SpanContext, SpanKind, StatusCode

        # SpanContext is a tuple (trace_id, span_id, ...); indexing it costs a third of
        # its properties. Should a later SDK change that, every span takes the generic path.
        probe = SpanContext(trace_id=1, span_id=2, is_remote=False)
        self._span_type: type | None = ReadableSpan if probe[:2] == (1, 2) else None
        self._attributes_type = BoundedAttributes
        self._list_type: Any = BoundedList
        self._internal = SpanKind.INTERNAL
        self._error = StatusCode.ERROR
        self._ok = StatusCode.OK
        self._bases: dict[tuple[int, int], _Base] = {}
        self._last: _Base | None = None
        self._traces: dict[int, tuple[str, str]] = {}
        self._parents: dict[int, str] = {}
        self._ms_prefix = (-1, "")  # one tuple, so that two exporting threads never mix

    def convert(self, spans: Iterable[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """(rows made here, spans left for the generic path), each in the given order."""
        rows: list[dict[str, Any]] = []
        others: list[Any] = []
        span_type = self._span_type
        for span in spans:
            row = None
            if type(span) is span_type:
                try:
                    row = self._row(span)
                except Exception:
                    row = None  # the generic path counts what really fails
            if row is None:
                others.append(span)
            else:
                rows.append(row)
        return rows, others

    def _row(self, span: Any) -> dict[str, Any] | None:
        start = span._start_time
        attributes = span._attributes
        name = span._name
        if (type(start) is not int or not 0 < start < _INT64 or type(name) is not str
                or type(attributes) is not self._attributes_type):
            return None
        base = self._last
        if (base is None or base.resource is not span._resource
                or base.scope is not span._instrumentation_scope):
            base = self._base(span._resource, span._instrumentation_scope)
        values = attributes._dict
        attrs: dict[str, Any] = base.attrs.copy()
        attrs.update(values)  # one resize; then only the values that are not text
        long_values = base.long_values
        for key, value in values.items():
            kind = type(value)
            if kind is str:
                if len(value) > VALUE_LIMIT:  # type: ignore[arg-type]
                    long_values = True
                continue
            if kind is int:
                attrs[key] = str(value)
            elif kind is float:
                attrs[key] = repr(value)
            elif value is None:
                return None  # span_event keeps the resource's value: the generic path's case
            else:
                attrs[key] = attr_text(value)
                long_values = long_values or len(attrs[key]) > VALUE_LIMIT
        events = span._events
        dropped_events = 0
        if type(events) is self._list_type:
            dropped_events = events.dropped
            events = events._dq
        if events:
            kept = events_text(sdk_events(events))
            if kept:
                attrs[EVENTS_KEY] = kept
                long_values = long_values or len(kept) > VALUE_LIMIT
        if long_values:
            cut_values(attrs)
        kind = span._kind
        if kind is not self._internal:
            attrs["otel.span_kind"] = kind.name
        if base.scope_name:
            attrs["otel.scope"] = base.scope_name  # over an attribute of that name
        links = span._links
        dropped_links = 0
        if type(links) is self._list_type:
            dropped_links = links.dropped
            links = links._dq  # a BoundedList's own iteration copies under a lock
        if links:
            attrs[LINKS_KEY] = attr_text(sdk_links(links))
        if attributes.dropped or dropped_events or dropped_links:
            add_dropped(attrs, attributes.dropped, dropped_events, dropped_links)
        context = span._context
        trace = self._traces.get(context[0]) or self._trace(context[0])
        span_hex = context[1].to_bytes(8, "big").hex()
        ms = start // 1_000_000
        prefix = self._ms_prefix
        if prefix[0] != ms:
            prefix = self._prefix(ms)
        failed = span._status.status_code is self._error
        if span._status.status_code is self._ok:
            attrs[STATUS_KEY] = "OK"
        end = span._end_time
        if type(end) is not int or end < start:
            return None  # unended: the generic path refuses it and counts why
        parent = span._parent
        # Every column a span usually has in one literal: the dict is sized once.
        row: dict[str, Any] = {
            "event_id":
                f"{prefix[1]}{trace[1]}{VARIANT[span_hex[0]]}{span_hex[1:4]}-{span_hex[4:]}",
            "kind": "span", "source": "otel", "name": name,
            "state": "FAILED" if failed else "FINISHED",
            "trace_id": trace[0], "span_id": span_hex, "time": start, "attrs": attrs,
            "duration_s": (end - start) / 1e9,
            "parent_span_id": None if parent is None else (
                self._parents.get(parent[1]) or self._parent_hex(parent[1])),
        }
        if not attrs:
            del row["attrs"]
        if parent is None:
            del row["parent_span_id"]
        if base.columns:
            row.update(base.columns)  # the resource's run and job ids
        plain = SPECIAL_KEYS.isdisjoint(values)
        if not plain and not _add_special(row, values, base):
            return None
        if failed or events:
            self._add_error(row, span, failed, NOTHING if plain else values, events)
        return row

    def _add_error(self, row: dict[str, Any], span: Any, failed: bool,
                   special: Mapping[str, Any], events: Iterable[Any]) -> None:
        exception = None
        for event in events:
            if event.name == EXCEPTION_EVENT:
                exception = event.attributes
        if failed or exception:
            add_error(row, failed, span._status.description or "", special, exception or {})

    def _base(self, resource: Any, scope: Any) -> _Base:
        # One provider has one Resource and a few scopes: convert them once, not per span.
        key = (id(resource), id(scope))
        base = self._bases.get(key)
        if base is None or base.resource is not resource or base.scope is not scope:
            if len(self._bases) >= 64:
                self._bases.clear()
            base = self._bases[key] = _Base(resource, scope)
        self._last = base
        return base

    def _trace(self, trace_id: int) -> tuple[str, str]:
        """The trace id in hex, and its part of the event id ("7" + last 3 digits + "-")."""
        if len(self._traces) >= _CACHE_LIMIT:
            self._traces.clear()
        trace_hex = trace_id.to_bytes(16, "big").hex()  # beyond 128 bits: the generic path
        cached = self._traces[trace_id] = (trace_hex, f"7{trace_hex[-3:]}-")
        return cached

    def _parent_hex(self, span_id: int) -> str:
        # Siblings share a parent, which often ends in the same batch: format it once.
        if len(self._parents) >= _CACHE_LIMIT:
            self._parents.clear()
        parent_hex = self._parents[span_id] = span_id.to_bytes(8, "big").hex()
        return parent_hex

    def _prefix(self, ms: int) -> tuple[int, str]:
        """The event id's time part; spans of one millisecond share it."""
        stamp = ms.to_bytes(6, "big").hex()  # span_event_id's f"{ms:012x}", at half the cost
        cached = self._ms_prefix = (ms, f"{stamp[:8]}-{stamp[8:]}-")
        return cached


_ID_KEYS = frozenset((*RUN_ID_KEYS, *JOB_ID_KEYS))
_STEP_FIRST, _STEP_SECOND = STEP_KEYS


def _add_special(row: dict[str, Any], values: Mapping[str, Any], base: _Base) -> bool:
    """run_id, job_id and step as `add_special_columns` finds them (a step attribute is
    common, run and job attributes rare); False for a step outside int64 (the generic
    path's business)."""
    if not _ID_KEYS.isdisjoint(values):
        add_special_columns(row, values, base.resource_attrs)  # over the resource's ids
        step = row.get("step")
        return step is None or -_INT64 <= step < _INT64
    step = values.get(_STEP_FIRST)
    if step is None or step == "":
        step = values.get(_STEP_SECOND)
    if type(step) is int:
        row["step"] = step
        return -_INT64 <= step < _INT64
    return True
