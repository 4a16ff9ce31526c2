"""OpenTelemetry: the span exporter to the agent, and trace context shared with evagg's
own spans (docs/opentelemetry.md). The code is in emitters/integrations/otel.py."""

from emitters.integrations.otel import (
    EXCEPTION_EVENT,
    EvaggSpanExporter,
    attach_trace_context,
    default_otlp_endpoint,
    get_tracer,
    init_telemetry,
    inject_trace_context,
    readable_span_event,
    resource_text,
    shutdown_telemetry,
    span_event,
    urandom_id_generator,
)

__all__ = ["EXCEPTION_EVENT", "EvaggSpanExporter", "attach_trace_context",
           "default_otlp_endpoint", "get_tracer", "init_telemetry", "inject_trace_context",
           "readable_span_event", "resource_text", "shutdown_telemetry", "span_event",
           "urandom_id_generator"]
