"""emitters.otel with the real OTel SDK: ids, span rows, modes and propagation."""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

import emitters
from aggregator.decode import otlp
from emitters import otel, tracecontext
from emitters.integrations import otel_rows


@pytest.fixture(autouse=True)
def telemetry_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # Spans these tests end go to a socket nobody listens on, never a real agent.
    emitters.configure(socket=str(tmp_path_factory.mktemp("nosock") / "none.sock"))
    yield
    otel.shutdown_telemetry(timeout_s=0.1)


def _ids(generator: Any, seed: int) -> list[int]:
    random.seed(seed)
    return [generator.generate_trace_id(), generator.generate_span_id()]


def test_ids_ignore_random_seed() -> None:
    # Control: the SDK's default generator repeats itself after the same seed.
    assert _ids(RandomIdGenerator(), 7) == _ids(RandomIdGenerator(), 7)
    ours = otel.urandom_id_generator()
    first, second = _ids(ours, 7), _ids(ours, 7)
    assert first != second
    assert first[0] < 2**128 and first[1] < 2**64 and all(first)


def _seeded_ids(queue: Any) -> None:
    random.seed(1234)
    generator = otel.urandom_id_generator()
    queue.put([generator.generate_trace_id() for _ in range(3)])


def test_two_seeded_worker_processes_draw_different_ids() -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_seeded_ids, args=(queue,)) for _ in range(2)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=30) for _ in workers]
    for w in workers:
        w.join(30)
    assert set(results[0]).isdisjoint(results[1])


def _recorded() -> tuple[list[Any], Resource]:
    memory = InMemorySpanExporter()
    resource = Resource.create({"service.name": "svc", "evagg.job_id": "job-1"})
    provider = TracerProvider(resource=resource, id_generator=otel.urandom_id_generator())
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope-a")
    outer_attrs = {"run_id": "r9", "sizes": [1, 2]}
    with tracer.start_as_current_span("outer", kind=trace.SpanKind.SERVER,
                                      attributes=outer_attrs) as outer:
        link = trace.Link(outer.get_span_context())
        with pytest.raises(KeyError), tracer.start_as_current_span("inner", links=[link]):
            raise KeyError("missing")
    provider.shutdown()
    return list(memory.get_finished_spans()), resource


def test_socket_rows_equal_the_agents_otlp_rows() -> None:
    spans, resource = _recorded()
    from_socket = [otel.readable_span_event(s, otel.resource_text(resource.attributes))
                   for s in spans]
    body = encode_spans(spans).SerializeToString()
    from_otlp = otlp.decode_otlp_traces(body, otlp.PROTOBUF).rows
    assert from_socket == from_otlp
    inner, outer = from_socket
    assert inner["state"] == "FAILED" and inner["error_type"] == "KeyError"
    assert inner["parent_span_id"] == outer["span_id"]
    assert inner["attrs"]["otel.links"] == f'["{outer["trace_id"]}-{outer["span_id"]}"]'
    assert outer["run_id"] == "r9" and outer["job_id"] == "job-1"
    assert outer["attrs"]["otel.span_kind"] == "SERVER"
    assert outer["attrs"]["sizes"] == "[1,2]"


def test_span_event_id_is_fixed_by_the_span_and_sorts_by_time() -> None:
    a = otel_rows.span_event_id("ab" * 16, "cd" * 8, 1_700_000_000_000_000_000)
    assert a == otel_rows.span_event_id("ab" * 16, "cd" * 8, 1_700_000_000_000_000_000)
    assert a != otel_rows.span_event_id("ab" * 16, "ce" * 8, 1_700_000_000_000_000_000)
    later = otel_rows.span_event_id("ab" * 16, "cd" * 8, 1_800_000_000_000_000_000)
    assert a[14] == "7" and a < later


def test_exporter_counts_failures_and_never_raises() -> None:
    exporter = otel.EvaggSpanExporter()
    spans, _ = _recorded()

    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("not a span")

    result = exporter.export([Broken(), *spans[:0]])
    assert result.name == "SUCCESS"
    assert exporter.errors == {"RuntimeError": 1}


def test_none_mode_is_a_noop_tracer() -> None:
    assert otel.init_telemetry("svc", exporter="none") is None
    with otel.get_tracer("t").start_as_current_span("x") as span:
        assert not span.is_recording()
    with pytest.raises(ValueError, match="exporter must be"):
        otel.init_telemetry("svc", exporter="zipkin")


def test_default_otlp_endpoint_follows_the_agents_listen_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EVAGG_HTTP_LISTEN", "0.0.0.0:5050")
    assert otel.default_otlp_endpoint() == "http://127.0.0.1:5050/v1/traces"
    monkeypatch.delenv("EVAGG_HTTP_LISTEN")
    assert otel.default_otlp_endpoint() == "http://127.0.0.1:4040/v1/traces"


def test_provider_carries_service_and_run_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVAGG_RUN_ID", "run-env")
    provider = otel.init_telemetry("svc", exporter="evagg", attributes={"team": "x"})
    attrs = provider.resource.attributes
    assert (attrs["service.name"], attrs["evagg.run_id"], attrs["team"]) == ("svc", "run-env", "x")
    with otel.get_tracer("t").start_as_current_span("x") as span:
        assert span.is_recording()


def test_otel_path_injects_and_attaches_with_the_otel_propagator() -> None:
    otel.init_telemetry("svc", exporter="evagg")
    tracer = otel.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent:
        meta = otel.inject_trace_context({"unrelated": "kept"})
    ids = parent.get_span_context()
    assert meta["traceparent"] == f"00-{ids.trace_id:032x}-{ids.span_id:016x}-01"
    assert meta["unrelated"] == "kept"
    token = otel_context.attach(otel_context.Context())  # as in a fresh process
    try:
        with otel.attach_trace_context(meta), tracer.start_as_current_span("child") as child:
            assert child.parent.span_id == ids.span_id
            assert child.get_span_context().trace_id == ids.trace_id
        assert not trace.get_current_span().get_span_context().is_valid
    finally:
        otel_context.detach(token)


def test_meta_written_without_otel_reads_on_the_otel_path_and_back() -> None:
    with tracecontext.span() as ours:
        meta = otel.inject_trace_context({})  # no provider, no OTel span: tracecontext
    assert ours.context is not None
    assert meta["traceparent"].split("-")[2] == ours.context.span_id
    otel.init_telemetry("svc", exporter="evagg")
    with otel.attach_trace_context(meta), otel.get_tracer("t").start_as_current_span("c") as c:
        assert f"{c.parent.span_id:016x}" == ours.context.span_id
        back = otel.inject_trace_context({})
    with tracecontext.attach_trace_context(back) as attached:
        assert attached.context is not None
        assert attached.context.span_id == f"{c.get_span_context().span_id:016x}"


_WITHOUT_OTEL = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
import emitters
from emitters import otel, tracecontext
assert otel.init_telemetry("svc") is None
with otel.get_tracer("t").start_as_current_span("x") as span:
    span.set_attribute("a", 1)
with tracecontext.span() as ours:
    meta = otel.inject_trace_context({})
with otel.attach_trace_context(meta) as attached:
    assert attached.context.trace_id == ours.context.trace_id
otel.shutdown_telemetry()
assert "opentelemetry" not in sys.modules
print("ok")
"""


def test_module_works_without_opentelemetry_installed() -> None:
    done = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "OpenTelemetry SDK is not installed" in done.stderr
