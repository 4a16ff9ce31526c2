"""The socket exporter's fast path (emitters/integrations/otel_fast.py and
Emitter.enqueue_built) against the generic path (readable_span_event through emit()), with
the real OTel SDK and a wire peer."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, Status, StatusCode

from aggregator.decode import otlp
from emitters import Emitter
from emitters.integrations import otel, otel_fast  # the fast path is patched where it is used
from emitters.integrations.otel_fast import SpanRows
from emitters.integrations.otel_rows import CUT_KEY, VALUE_LIMIT
from tests.emitters.fakeagent import FakeAgent, short_socket_path

CONTEXT = {"job_id": "ctx-job", "node_id": "n7", "attrs": {"team": "ml", "service.name": "ctx"}}
VALUES: dict[str, Any] = {
    "s": "text", "empty": "", "b": True, "f": False, "i": -7, "x": 0.5, "nan": math.nan,
    "inf": math.inf, "ninf": -math.inf, "ss": ["a", "b"], "bs": [True, False], "is": [1, 2],
    "fs": [1.5, math.nan, math.inf], "none_yet": (), "odd": "lone \ud800 surrogate",
}


def _provider(resource: dict[str, Any], memory: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create(resource),
                              id_generator=otel.urandom_id_generator())
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider


def _varied_spans() -> list[Any]:
    """SDK spans with every attribute value type, events, links, kinds, errors, two
    resources and three scopes (one unnamed), interleaved in one batch."""
    memory = InMemorySpanExporter()
    first = _provider({"service.name": "a", "evagg.run_id": "res-run", "port": 80}, memory)
    second = _provider({"service.name": "b", "job_id": "res-job"}, memory)
    tracer, other, unnamed = first.get_tracer("s1"), second.get_tracer("s2"), first.get_tracer("")
    with tracer.start_as_current_span("root", kind=trace.SpanKind.SERVER,
                                      attributes=VALUES) as root:
        link = trace.Link(root.get_span_context(), {"why": "follows"})
        for i, kind in enumerate(trace.SpanKind):
            with other.start_as_current_span(f"k{i}", kind=kind, links=[link],
                                             attributes={"evagg.step": i, "run_id": "attr"}):
                pass
        with tracer.start_as_current_span("steps", attributes={"evagg.step": "", "step": 3,
                                                               "ray.job_id": 12}) as span:
            span.add_event("checkpoint", {"n": 1})
        with tracer.start_as_current_span("text-step", attributes={"evagg.step": "x",
                                                                   "step": 4}):
            pass
        with unnamed.start_as_current_span("unnamed", attributes={"otel.scope": "mine"}):
            pass
        with contextlib.suppress(ValueError), tracer.start_as_current_span("raises"):
            raise ValueError("bad value")
        with tracer.start_as_current_span("status") as span:
            span.set_attribute("error.type", "Timeout")
            span.set_status(Status(StatusCode.ERROR, "took too long"))
        with tracer.start_as_current_span("error-no-text") as span:
            span.set_status(Status(StatusCode.ERROR))
        with tracer.start_as_current_span("ok") as span:
            span.set_status(Status(StatusCode.OK))
    limited = TracerProvider(span_limits=SpanLimits(max_span_attributes=2, max_events=4,
                                                    max_links=1))
    limited.add_span_processor(SimpleSpanProcessor(memory))
    with limited.get_tracer("l").start_as_current_span(  # what the limits drop, counted
            "limited", attributes={f"a{i}": i for i in range(4)}, links=[link, link]) as span:
        for i in range(2):  # the oldest events are the ones dropped
            span.add_event(f"dropped-{i}")
        span.add_event("first", {"k": [1, 2]}, timestamp=10**18)
        span.record_exception(KeyError("retried"))  # an earlier exception stays an event
        span.add_event("later")
        span.record_exception(TimeoutError("gave up"))  # the last: the error columns
    first.shutdown()
    second.shutdown()
    limited.shutdown()
    recorded = list(memory.get_finished_spans())
    start = 10**18
    handmade = [  # no scope, no parent, no time between start and end
        ReadableSpan(name, context=SpanContext(trace_id=0xABC, span_id=i + 1, is_remote=False),
                     attributes=BoundedAttributes(attributes={"step": i}),
                     resource=recorded[0].resource, start_time=start, end_time=end)
        for i, (name, end) in enumerate((("zero", start), ("one-ns", start + 1)))]
    return recorded + handmade


def _unusual_spans() -> list[Any]:
    """Spans the fast path leaves to the generic one."""
    memory = InMemorySpanExporter()
    provider = _provider({"service.name": "u"}, memory)
    tracer = provider.get_tracer("u")
    with tracer.start_as_current_span("huge-step", attributes={"step": 2**63}):
        pass
    with tracer.start_as_current_span("none-value", attributes={"service.name": "mine"}):
        pass
    provider.shutdown()
    huge, with_none = memory.get_finished_spans()
    held: Any = with_none._attributes
    held._dict["service.name"] = None  # as a hand-made mapping might hold
    context = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=False)
    plain_dict = ReadableSpan("plain-dict", context=context, attributes={"k": 1},
                              resource=huge.resource, start_time=10**18, end_time=10**18 + 5)

    class OwnSpan(ReadableSpan):
        pass

    subclass = OwnSpan("subclass", context=context, resource=huge.resource,
                       start_time=10**18, end_time=10**18 + 9)
    return [huge, with_none, plain_dict, subclass]


def _delivered(send: Any, flush_interval: float = 0.01) -> list[dict[str, Any]]:
    """What a wire peer stores of the events `send(emitter)` hands to a fresh emitter."""
    sock_path = short_socket_path()  # the peer removes its directory when it stops
    emitter = Emitter(socket=sock_path, flush_interval=flush_interval, **CONTEXT)
    try:
        with FakeAgent(sock_path) as agent:
            send(emitter)
            assert emitter.flush(20)
            return agent.events()
    finally:
        emitter.close(0.5)


def _by_id(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: (e["event_id"], e["name"]))


def _generic(spans: list[Any]) -> Any:
    def send(emitter: Emitter) -> None:
        for span in spans:
            row = otel.readable_span_event(span, otel.resource_text(span.resource.attributes))
            emitter.emit(**row)
    return send


def _exported(spans: list[Any]) -> Any:
    def send(emitter: Emitter) -> None:
        exporter = otel.EvaggSpanExporter(emitter)
        assert exporter.export(spans).name == "SUCCESS"
        assert not exporter.errors
    return send


def test_fast_rows_reach_the_agent_as_the_generic_paths_rows() -> None:
    spans = _varied_spans()
    rows, others = SpanRows().convert(spans)
    assert len(rows) == len(spans) and not others  # all took the fast path
    fast = _delivered(_exported(spans))
    assert _by_id(fast) == _by_id(_delivered(_generic(spans)))
    by_name = {e["name"]: e for e in fast}
    root = by_name["root"]
    assert root["attrs"]["nan"] == "nan" and root["attrs"]["fs"] == "[1.5,null,null]"
    assert root["attrs"]["odd"] == "lone \\ud800 surrogate"  # scrubbed by the emitter
    assert (root["run_id"], root["job_id"], root["node_id"]) == ("res-run", "ctx-job", "n7")
    assert root["attrs"]["team"] == "ml" and root["attrs"]["service.name"] == "a"
    assert (by_name["k0"]["run_id"], by_name["k0"]["job_id"]) == ("attr", "res-job")
    assert (by_name["steps"]["step"], by_name["steps"]["job_id"]) == (3, "12")
    assert "step" not in by_name["text-step"]
    assert by_name["unnamed"]["attrs"]["otel.scope"] == "mine"
    assert by_name["raises"]["error_type"] == "ValueError"
    assert by_name["status"]["error_message"] == "took too long"
    assert by_name["status"]["error_type"] == "Timeout"
    assert by_name["error-no-text"]["state"] == "FAILED"
    assert by_name["zero"]["duration_s"] == 0.0 and by_name["one-ns"]["duration_s"] == 1e-9
    assert "otel.scope" not in by_name["zero"]["attrs"]


def test_unusual_spans_take_the_generic_path_with_the_same_rows() -> None:
    spans = _unusual_spans()
    rows, others = SpanRows().convert(spans)
    assert rows == [] and others == spans
    fast = _delivered(_exported(spans))
    assert _by_id(fast) == _by_id(_delivered(_generic(spans)))
    assert {e["name"] for e in fast} == {"huge-step", "none-value", "plain-dict", "subclass"}


def test_fast_rows_equal_the_agents_otlp_rows() -> None:
    spans = [s for s in _varied_spans() if s.resource.attributes["service.name"] == "a"]
    rows, _ = SpanRows().convert(spans)
    for row in rows:
        row["attrs"].pop("odd", None)  # OTLP's encoder drops a string it cannot encode
    body = encode_spans(spans).SerializeToString()
    from_otlp = otlp.decode_otlp_traces(body, otlp.PROTOBUF).rows
    assert sorted(rows, key=_event_id) == sorted(from_otlp, key=_event_id)


def _event_id(row: dict[str, Any]) -> str:
    return str(row["event_id"])


def _long_valued_spans() -> list[Any]:
    """Spans with values over the cut: a text, a list that reads long as text, and a
    resource value; one span with nothing to cut beside them."""
    memory = InMemorySpanExporter()
    provider = _provider({"service.name": "long", "note": "n" * (VALUE_LIMIT + 1)}, memory)
    tracer = provider.get_tracer("long")
    with tracer.start_as_current_span("prompt", attributes={
            "prompt": "p" * (3 * VALUE_LIMIT), "tokens": list(range(VALUE_LIMIT)),
            "short": "s", "n": 3}):
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_long_values_are_cut_alike_on_every_path_and_the_span_kept() -> None:
    spans = _long_valued_spans()
    fast, others = SpanRows().convert(spans)
    assert not others
    generic = [otel.readable_span_event(s, otel.resource_text(s.resource.attributes))
               for s in spans]
    from_otlp = otlp.decode_otlp_traces(encode_spans(spans).SerializeToString(),
                                        otlp.PROTOBUF)
    assert fast == generic == from_otlp.rows
    (attrs,) = [row["attrs"] for row in fast]
    assert attrs["prompt"] == "p" * VALUE_LIMIT and attrs["tokens"].startswith("[0,1,2,")
    assert len(attrs["tokens"]) == VALUE_LIMIT and len(attrs["note"]) == VALUE_LIMIT
    assert attrs[CUT_KEY] == '["note","prompt","tokens"]'
    assert (attrs["short"], attrs["n"]) == ("s", "3")
    assert from_otlp.cut_attributes == 3
    delivered: list[Any] = []

    def send(emitter: Emitter) -> None:
        exporter = otel.EvaggSpanExporter(emitter)
        exporter.export(spans)
        delivered.append(exporter.cut_attributes)

    assert [e["attrs"][CUT_KEY] for e in _delivered(send)] == ['["note","prompt","tokens"]']
    assert delivered == [3]


def test_spans_without_a_usable_end_are_refused_counted_and_the_rest_sent() -> None:
    resource = _varied_spans()[0].resource
    context = SpanContext(trace_id=0xABC, span_id=0x1, is_remote=False)
    start = 10**18
    odd = [ReadableSpan(name, context=context, resource=resource, start_time=begin,
                        end_time=end)
           for name, begin, end in (("open", start, None), ("backwards", start, start - 1),
                                    ("no-start", None, start), ("fine", start, start + 5))]
    refused: list[Any] = []

    def send(emitter: Emitter) -> None:
        exporter = otel.EvaggSpanExporter(emitter)
        exporter.export(odd)
        refused.append((dict(exporter.refused), dict(exporter.errors)))

    assert [e["name"] for e in _delivered(send)] == ["fine"]
    assert refused == [({"unended": 3}, {})]


def test_caches_stay_bounded_and_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel_fast, "_CACHE_LIMIT", 2)
    memory = InMemorySpanExporter()
    provider = _provider({"service.name": "c"}, memory)
    tracer = provider.get_tracer("c")
    for i in range(5):
        with tracer.start_as_current_span(f"root{i}"), tracer.start_as_current_span("child"):
            pass
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    converter = SpanRows()
    rows, _ = converter.convert(spans)
    expected = [otel.readable_span_event(s, otel.resource_text(s.resource.attributes))
                for s in spans]
    assert rows == expected
    assert len(converter._traces) <= 2 and len(converter._parents) <= 2


def test_a_span_that_fails_on_both_paths_is_counted_and_the_rest_delivered() -> None:
    spans = _varied_spans()
    memory = InMemorySpanExporter()
    provider = _provider({"service.name": "h"}, memory)
    with provider.get_tracer("h").start_as_current_span("huge", attributes={"n": 10**5000}):
        pass
    provider.shutdown()
    exporter_errors: list[Any] = []

    def send(emitter: Emitter) -> None:
        exporter = otel.EvaggSpanExporter(emitter)
        exporter.export([*spans[:3], *memory.get_finished_spans(), *spans[3:]])
        exporter_errors.append(dict(exporter.errors))

    delivered = _delivered(send)
    assert exporter_errors == [{"ValueError": 1}]  # str() of an int of 5001 digits
    assert len(delivered) == len(spans) and "huge" not in {e["name"] for e in delivered}


def test_enqueue_built_drops_and_counts_what_does_not_fit(sock_path: Path) -> None:
    spans = _varied_spans()
    emitter = Emitter(socket=sock_path, flush_interval=0.01, max_pending=5)
    try:
        exporter = otel.EvaggSpanExporter(emitter)
        exporter.export(spans)  # no agent yet: the sender cannot drain the queue
        dropped = emitter.stats().dropped["buffer_full"]
        assert dropped >= len(spans) - 5 and not exporter.errors
        with FakeAgent(sock_path) as agent:
            agent.wait_for(lambda: any(e["kind"] == "loss" for e in agent.events()))
            assert not emitter.flush(5)  # a loss since the last flush makes it False
            assert emitter.flush(20)
            events = agent.events()
    finally:
        emitter.close(0.5)
    (loss,) = [e for e in events if e["kind"] == "loss"]
    assert loss["metrics"] == {"events": float(dropped), "events_total": float(dropped)}
    assert len([e for e in events if e["kind"] == "span"]) + dropped == len(spans)


def test_enqueue_built_after_close_is_dropped_and_counted(sock_path: Path) -> None:
    emitter = Emitter(socket=sock_path, flush_interval=0.01)
    emitter.close(0.1)
    emitter.enqueue_built([{"event_id": "x", "kind": "span"}] * 3)
    assert emitter.stats().dropped == {"closed": 3}
    assert emitter.stats().pending == 0


def test_without_a_fast_path_every_span_goes_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> SpanRows:
        raise ImportError("an SDK without BoundedList")

    monkeypatch.setattr(otel, "SpanRows", missing)
    spans = _varied_spans()
    errors: list[Any] = []

    def send(emitter: Emitter) -> None:
        exporter = otel.EvaggSpanExporter(emitter)
        for half in (spans[:5], spans[5:]):
            assert exporter.export(half).name == "SUCCESS"
        errors.append(dict(exporter.errors))

    delivered = _delivered(send)
    assert errors == [{"ImportError": 1}]  # tried once, then the generic path only
    assert _by_id(delivered) == _by_id(_delivered(_generic(spans)))


def test_built_and_emitted_events_share_frames_in_order() -> None:
    spans = _varied_spans()

    def send(emitter: Emitter) -> None:
        exporter = otel.EvaggSpanExporter(emitter)
        for i, span in enumerate(spans):  # one drain sees both kinds of queued item
            emitter.emit(kind="task", name="between", task_id=str(i), step=i, shard=i)
            exporter.export([span])
        emitter.emit(kind="task", name="between", task_id="last", step=-1, shard=-1)

    events = _delivered(send, flush_interval=60)  # one drain, at flush(), takes them all
    assert [e["kind"] for e in events[:4]] == ["task", "span", "task", "span"]
    tasks = [e for e in events if e["kind"] == "task"]
    assert len(tasks) == len(spans) + 1 and len({e["event_id"] for e in tasks}) == len(tasks)
    assert all(e["attrs"] == {**CONTEXT["attrs"], "shard": str(e["step"])} for e in tasks)
    spans_only = [e for e in events if e["kind"] == "span"]
    assert _by_id(spans_only) == _by_id(_delivered(_generic(spans)))


def test_a_bad_built_row_is_counted_and_costs_its_neighbours_nothing() -> None:
    good = {"event_id": "good-1", "kind": "span", "name": "kept", "time": 10**18}
    bad = {"event_id": "bad-1", "kind": "span", "name": "lost", "attrs": 5}  # not a mapping
    counted: list[int] = []

    def send(emitter: Emitter) -> None:
        emitter.emit(kind="task", name="before")
        emitter.enqueue_built([bad, good])
        emitter.emit(kind="task", name="after")
        assert emitter.flush(20) is False  # a loss since the last flush
        counted.append(emitter.stats().dropped.get("unencodable", 0))

    delivered = _delivered(send, flush_interval=60)  # one drain takes all four
    names = [e["name"] for e in delivered if e["kind"] != "loss"]
    assert names == ["before", "kept", "after"] and counted == [1]
