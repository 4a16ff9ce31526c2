"""A span's events and links on the Trace page, in headless Chromium at 1280 px: spans
from the OpenTelemetry SDK through the agent's OTLP/HTTP port into its lake.

They showed as one line of JSON text among the attributes (`otel.events`, with times in
nanoseconds since 1970; `otel.links`, ids joined by a dash), where an OTel user looks for
them as Jaeger shows them: events at their offset into the span, links to their trace.
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving

LINKED_TRACE = "ab" * 16
LINKED_SPAN = "cd" * 8


def send_a_span_with_an_event_and_a_link(agent: AgentProcess) -> str:
    """`charge`, 5 ms long, with `cart loaded` 2 ms in and a link to a batch's span."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "payments"}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
    batch = trace.SpanContext(int(LINKED_TRACE, 16), int(LINKED_SPAN, 16), is_remote=True)
    start = 1_790_000_000_000_000_000
    span = provider.get_tracer("shop").start_span(
        "charge", start_time=start, links=[trace.Link(batch, {"link.reason": "batch"})])
    span.add_event("cart loaded", {"items": 3}, timestamp=start + 2_000_000)
    span.end(end_time=start + 5_000_000)
    provider.shutdown()
    return f"{span.get_span_context().trace_id:032x}"


def test_a_spans_events_and_links_show_as_such_on_the_trace_page(
        agent: AgentProcess, tmp_path: Path) -> None:
    trace_id = send_a_span_with_an_event_and_a_link(agent)
    agent.wait_rows(f"SELECT name FROM events WHERE trace_id = '{trace_id}'", 1)
    store = Store(StoreOptions(str(agent.lake_dir), refresh_s=0.2))
    try:
        with serving(store) as url, chromium() as browser, \
                tab(browser, url, width=1280, height=900) as page:
            page.goto(f"/#/trace?trace_id={trace_id}")
            expect(page.locator("h2", has_text="Waterfall")).to_have_text("Waterfall (1 span)")
            page.locator("svg.waterfall g.span-row").first.click()
            detail = page.locator(".span-detail")
            event = detail.locator("tr.span-event")
            expect(event).to_have_count(1)
            expect(event).to_contain_text("+2.0 ms")
            expect(event).to_contain_text("cart loaded")
            expect(event).to_contain_text("items=3")
            link = detail.locator("tr.span-link")
            expect(link).to_contain_text(LINKED_SPAN)
            expect(link).to_contain_text("link.reason=batch")
            expect(link.locator("a")).to_have_attribute(
                "href", f"#/trace?trace_id={LINKED_TRACE}")
            detail.get_by_text("attributes (").click()
            expect(detail.locator("dl.attrs")).not_to_contain_text("otel.events")
            expect(detail.locator("dl.attrs")).not_to_contain_text("otel.links")
            page.screenshot(path=str(ARTIFACTS / "trace-span-events-links.png"))
    finally:
        store.close()
