"""evagg's integrations with other libraries: PyTorch training loops, Ray tasks and
actors, OpenTelemetry spans, and the queue time of requests handed between processes.

Each module imports its library only when used, so importing `emitters` stays standard
library and orjson. Producers import them by their public names, `emitters.torch`,
`emitters.ray`, `emitters.otel` and `emitters.queueing` (each a face of a few names over
the module here); the helpers beside them (`torch_steps`, `torch_trace`, `otel_fast`,
`otel_rows`) are theirs alone, and `otel_rows` the agent's OTLP route's too.
"""
