"""An actor that builds its own OpenTelemetry provider (with evagg's exporter, as
docs/opentelemetry.md shows) and attaches the caller's context: its spans are children
of the caller's span, in the caller's trace. Run in a process of its own: a provider is
global to a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ACTOR = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from emitters import otel

caller = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
with otel.attach_trace_context(caller):
    with trace.get_tracer("actor").start_as_current_span("rollout.work"):
        pass
span = memory.get_finished_spans()[0]
print(json.dumps({"trace": f"{span.context.trace_id:032x}",
                  "parent": f"{span.parent.span_id:016x}" if span.parent else None}))
"""


def test_a_provider_of_the_users_own_takes_the_attached_context() -> None:
    done = subprocess.run([sys.executable, "-c", ACTOR], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    span = json.loads(done.stdout.strip().splitlines()[-1])
    assert span == {"trace": "4bf92f3577b34da6a3ce929d0e0e4736", "parent": "00f067aa0ba902b7"}
