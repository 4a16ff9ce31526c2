"""HTTP bodies under http_max_body whose events, decoded, pass one spool record: stored
whole as several records, through /v1/events and through the OpenTelemetry SDK's own
exporter; only an event larger than a record is refused (413), and then nothing of its
body is stored."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

import orjson

from tests.agentproc import AgentProcess

# A record holds about 1 MiB here (a quarter of the spool's 4 MiB, less its header);
# max_frame is lowered so that the spool may be this small.
SMALL_SPOOL = {"spool_toml": 'max_bytes = "4MiB"\nsegment_bytes = "1MiB"',
               "agent_toml": 'max_frame = "128KiB"'}


def post(agent: AgentProcess, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def test_a_body_that_grows_past_a_spool_record_is_stored_whole(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """Tiny events grow about 14x into columns: 20,000 of them are several records."""
    agent = agent_factory(**SMALL_SPOOL).start()
    lines = b"".join(orjson.dumps({"kind": "task", "name": "tiny", "task_id": f"t{i}"}) + b"\n"
                     for i in range(20_000))
    status, answer = post(agent, lines)
    assert (status, answer["accepted"], answer["rejected"]) == (200, 20_000, 0), answer
    assert agent.stop() == 0
    assert agent.query("SELECT count(*), count(DISTINCT task_id) FROM events "
                       "WHERE name = 'tiny'") == [(20_000, 20_000)]
    assert "smaller parts" not in agent.log()


def test_one_event_larger_than_a_record_refuses_its_body_and_stores_none_of_it(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(**SMALL_SPOOL).start()
    good = b"".join(orjson.dumps({"kind": "task", "name": "beside", "task_id": f"b{i}"}) + b"\n"
                    for i in range(100))
    huge = orjson.dumps({"kind": "task", "name": "huge", "attrs": {"blob": "x" * 3_000_000}})
    status, answer = post(agent, good + huge + b"\n")
    assert status == 413 and answer["accepted"] == 0, answer
    assert "send it in smaller parts" in str(answer["errors"])
    assert post(agent, good)[0] == 200  # the same events without it go in
    assert agent.stop() == 0
    assert agent.query("SELECT count(*) FROM events WHERE name IN ('beside', 'huge')") == [(100,)]


def test_the_otel_sdks_exporter_sends_a_large_batch_that_is_stored_whole(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """The SDK's own OTLP/HTTP exporter, as a service batching many spans sends them: its
    export is a success only if the agent stored them (a 200 whose partial_success
    rejects them all is final to it: it would not send them again)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    agent = agent_factory(**SMALL_SPOOL).start()
    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("large-batch")
    for i in range(20_000):
        with tracer.start_as_current_span("load_shard", attributes={"shard": i}):
            pass
    spans = finished.get_finished_spans()
    exporter = OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces", timeout=60)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    exporter.shutdown()
    provider.shutdown()
    assert agent.stop() == 0
    assert agent.query("SELECT count(*), count(DISTINCT span_id) FROM events "
                       "WHERE kind = 'span' AND name = 'load_shard'") == [(20_000, 20_000)]
