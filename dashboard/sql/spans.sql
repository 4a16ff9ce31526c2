-- spans: one row per (trace_id, span_id). OpenTelemetry spans arrive as one event at
-- the start time with duration_s; an evagg-native span may send STARTED and then a
-- terminal event, which fold into the same row. Ops that ran while a span was current
-- (emitters.op, the torch tracker) carry its trace id and it as their parent: they are
-- spans of that trace here too, so a trace shows a step's forward and backward inside
-- the span that ran them; so are Ray's traced ops (ray_op, traced_remote), whose STARTED
-- and terminal event fold into one row like an evagg-native span's.
CREATE OR REPLACE VIEW spans AS
SELECT
    trace_id,
    span_id,
    max(parent_span_id) AS parent_span_id,
    max(name) AS name,
    coalesce(
        arg_max(state, time) FILTER (WHERE state IN ('FINISHED', 'FAILED')),
        max(state)
    ) AS state,
    min(time) AS start_at,
    max(duration_s) AS duration_s,
    coalesce(
        min(time) + to_microseconds(CAST(round(max(duration_s) * 1e6) AS BIGINT)),
        max(time) FILTER (WHERE state IN ('FINISHED', 'FAILED'))
    ) AS end_at,
    -- an op has no OTel service: its event's source (evagg, torch, ...) stands in
    coalesce(max(attrs['service.name']), max(source) FILTER (WHERE kind = 'op')) AS service,
    -- an OTel span stores its kind unless INTERNAL, the default: name it here, so that
    -- span_kind = 'INTERNAL' finds those spans as in Jaeger and Tempo (ops have none)
    coalesce(max(attrs['otel.span_kind']),
             CASE WHEN bool_or(kind = 'span' AND source = 'otel') THEN 'INTERNAL' END)
        AS span_kind,
    max(error_type) AS error_type,
    max(error_message) AS error_message,
    max(stack_trace) AS stack_trace,
    arg_max(attrs, time) AS attrs,  -- the last event's: an OTel span's one event
    max(node_id) AS node_id,
    max(job_id) AS job_id,
    max(task_id) AS task_id,
    max(source) AS source,
    max(step) AS step
FROM events
WHERE kind IN ('span', 'op') AND trace_id IS NOT NULL AND span_id IS NOT NULL
GROUP BY trace_id, span_id;

-- traces: one row per trace; the root is the span without a parent inside the trace
-- (the earliest one when there are several).
CREATE OR REPLACE VIEW traces AS
SELECT
    trace_id,
    arg_min(name, start_at) FILTER (WHERE parent_span_id IS NULL) AS root_name,
    arg_min(name, start_at) AS first_name,
    count(*) AS spans,
    count(*) FILTER (WHERE state = 'FAILED') AS failures,
    min(start_at) AS started_at,
    max(coalesce(end_at, start_at)) AS ended_at,
    epoch_us(max(coalesce(end_at, start_at))) / 1e6 - epoch_us(min(start_at)) / 1e6
        AS duration_s,
    list_sort(list_distinct(list(service))) AS services
FROM spans
GROUP BY trace_id;
