-- ops: one row per training op (kind = 'op'). Events of one op share span_id: a
-- STARTED event and a terminal FINISHED/FAILED event fold into one row. An op event
-- without span_id is an op by itself when it is terminal; a STARTED event without
-- span_id cannot be matched to its end and is left out. An op that is one event (the
-- torch tracker's, like OpenTelemetry's spans: spans.sql) is stamped at its start: its
-- end (`time`) is start + duration_s, as steps.sql's step_intervals reads it too.
CREATE OR REPLACE VIEW ops AS
WITH op_events AS (
    SELECT *, coalesce(span_id, event_id) AS op_id
    FROM events
    WHERE kind = 'op'
      AND (span_id IS NOT NULL OR state IS NULL OR state IN ('FINISHED', 'FAILED'))
)
SELECT
    op_id,
    max(run_id) AS run_id,
    max(step) AS step,
    max(name) AS name,
    coalesce(
        arg_max(state, time) FILTER (WHERE state IN ('FINISHED', 'FAILED')),
        max(state)
    ) AS state,
    coalesce(min(time) FILTER (WHERE state = 'STARTED'), min(time)) AS started_at,
    -- the terminal event's time, or start + duration_s where that is later
    greatest(max(time) FILTER (WHERE state IS NULL OR state <> 'STARTED'),
             CASE WHEN max(duration_s) BETWEEN 0 AND 1e9
                  THEN coalesce(min(time) FILTER (WHERE state = 'STARTED'), min(time))
                       + to_microseconds(CAST(round(max(duration_s) * 1e6) AS BIGINT)) END)
        AS time,
    max(duration_s) AS duration_s,
    arg_max(metrics, time) FILTER (WHERE metrics IS NOT NULL) AS metrics,
    arg_max(nonfinite, time) FILTER (WHERE nonfinite IS NOT NULL) AS nonfinite,
    max(error_type) AS error_type,
    max(error_message) AS error_message,
    max(stack_trace) AS stack_trace,
    max(job_id) AS job_id,
    max(task_id) AS task_id,
    max(node_id) AS node_id,
    max(worker_id) AS worker_id,
    max(pid) AS pid,
    max(attrs['rank']) AS rank,  -- a distributed job's rank (emitters.torch stamps it)
    max(trace_id) AS trace_id,
    max(source) AS source
FROM op_events
GROUP BY op_id;
