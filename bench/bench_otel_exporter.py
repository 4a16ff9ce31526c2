"""Worker CPU per span: EvaggSpanExporter (Unix socket) against the SDK's OTLPSpanExporter.

    python bench/bench_otel_exporter.py [--spans 20000] [--rounds 5]

The same finished spans (recorded once with the OTel SDK: five attributes, one parent,
a resource with service.name) go through each exporter in batches of 512, as a
BatchSpanProcessor hands them over, in interleaved rounds. A third row sends them the
generic way (`readable_span_event` and `emit()` per span, what the socket exporter does
for spans its fast path does not take), to show what the fast path saves. The peers
run in subprocesses so their work is not counted: an acking peer that speaks
emitters.wire for the socket exporter, and an aiohttp OTLP/HTTP receiver answering
ExportTraceServiceResponse for the OTLP exporter. CPU is this process's CPU clock (all
threads: the emitter's sender thread and the OTLP exporter's HTTP client included), read
after the last span is acknowledged.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ackpeer import start_ack_peer  # noqa: E402

BATCH = 512


OTLP_PEER = r"""
import socket, sys
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
async def traces(request):
    await request.read()
    return web.Response(body=answer, content_type="application/x-protobuf")
app = web.Application(client_max_size=64 << 20)
app.router.add_post("/v1/traces", traces)
sock = socket.socket(); sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
web.run_app(app, sock=sock, print=None)
"""


def start(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peer = subprocess.Popen([sys.executable, "-c", code, *args], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert peer.stdout is not None
    return peer, peer.stdout.readline().strip()


def record_spans(count: int, attributes: int = 5) -> list[Any]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from emitters.otel import urandom_id_generator

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}),
                              id_generator=urandom_id_generator())
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    with tracer.start_as_current_span("epoch"):
        for i in range(count - 1):
            with tracer.start_as_current_span("train_step") as span:
                values: dict[str, Any] = {"step": i, "batch_size": 256, "rank": 3,
                                          "phase": "train", "lr": 0.001}
                values.update((f"label.{k}", f"value-{k}") for k in range(attributes - 5))
                span.set_attributes(dict(list(values.items())[:attributes]))
    provider.shutdown()
    return list(memory.get_finished_spans())[:count]


def cpu_per_span(export: Callable[[list[Any]], Any], settle: Callable[[], Any],
                 spans: list[Any]) -> tuple[float, float]:
    """(CPU us per span, wall us per span) to export `spans` and see them acknowledged."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(0, len(spans), BATCH):
        export(spans[i : i + BATCH])
    settle()
    return ((time.process_time() - cpu0) / len(spans) * 1e6,
            (time.perf_counter() - wall0) / len(spans) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attributes", type=int, default=5, help="per span (5 or more)")
    args = parser.parse_args()

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from emitters import Emitter
    from emitters.otel import EvaggSpanExporter, readable_span_event, resource_text

    socket_path = Path(tempfile.mkdtemp(prefix="evagg-bench-")) / "events.sock"
    socket_peer = start_ack_peer(socket_path)
    otlp_peer, port = start(OTLP_PEER)
    try:
        spans = record_spans(args.spans, args.attributes)
        # The recorded spans stay alive for every round, which a real worker's would not:
        # keep them out of the collector's way so it times each exporter's own garbage.
        gc.freeze()
        emitter = Emitter(socket=str(socket_path), max_buffer_bytes=256 << 20)
        evagg = EvaggSpanExporter(emitter)
        otlp = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
        resource = resource_text(spans[0].resource.attributes)

        def generic(batch: list[Any]) -> None:
            for span in batch:
                emitter.emit(**readable_span_event(span, resource))

        peers: dict[str, tuple[Callable[[list[Any]], Any], Callable[[], Any]]] = {
            "EvaggSpanExporter (socket)": (evagg.export, lambda: emitter.flush(60)),
            "OTLPSpanExporter (HTTP protobuf)": (otlp.export, lambda: None),
            "generic path (emit per span)": (generic, lambda: emitter.flush(60)),
        }
        for export, settle in peers.values():  # warm up: connections, imports, caches
            cpu_per_span(export, settle, spans[:2048])
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in peers}
        for _ in range(args.rounds):
            for name, (export, settle) in peers.items():
                results[name].append(cpu_per_span(export, settle, spans))
        report(results, len(spans), args.rounds, args.attributes)
        otlp.shutdown()
        emitter.close(5)
    finally:
        socket_peer.kill()
        otlp_peer.kill()


def report(results: dict[str, list[tuple[float, float]]], spans: int, rounds: int,
           attributes: int) -> None:
    print(f"{spans} spans with {attributes} attributes x {rounds} interleaved rounds, "
          f"batches of {BATCH}; median of rounds")
    print(f"{'exporter':34} {'CPU us/span':>12} {'wall us/span':>13}")
    medians = {}
    for name, samples in results.items():
        cpu = statistics.median(s[0] for s in samples)
        wall = statistics.median(s[1] for s in samples)
        medians[name] = cpu
        print(f"{name:34} {cpu:12.2f} {wall:13.2f}")
    evagg, otlp, generic = medians.values()
    print(f"OTLP costs {otlp / evagg:.1f}x the CPU of the evagg socket exporter (target >= 5x); "
          f"the generic path {generic / evagg:.1f}x")


if __name__ == "__main__":
    main()
