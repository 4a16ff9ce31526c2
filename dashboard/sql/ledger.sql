-- requests: one row per request handed from a producer to a consumer (emitters/queueing.py):
-- kind = 'request', task_id = the request id, states ENQUEUED, STARTED, ANSWERED, FAILED.
-- run_id travels with the request, so all its events share it; '' when none was set.
-- A retried request has several STARTED events and outcomes: `state` is the latest
-- outcome if it came at or after the latest start, else STARTED (running again), else
-- ENQUEUED (never picked up). Times come from two processes' clocks, so a skewed
-- consumer may show a start before the enqueue; queue_s is clamped at 0 by the emitter.
CREATE OR REPLACE VIEW requests AS
WITH folded AS (
    SELECT
        coalesce(run_id, '') AS run_id,
        task_id AS request_id,
        coalesce(arg_min(name, time) FILTER (WHERE state = 'ENQUEUED'), max(name)) AS name,
        min(time) FILTER (WHERE state = 'ENQUEUED') AS enqueued_at,
        min(time) FILTER (WHERE state = 'STARTED') AS started_at,
        max(time) FILTER (WHERE state = 'STARTED') AS last_started_at,
        count(*) FILTER (WHERE state = 'STARTED') AS starts,
        max(time) FILTER (WHERE state = 'ANSWERED') AS answered_at,
        max(time) FILTER (WHERE state = 'FAILED') AS failed_at,
        count(*) FILTER (WHERE state = 'FAILED') AS failures,
        arg_max(state, time) FILTER (WHERE state IN ('ANSWERED', 'FAILED')) AS outcome,
        max(time) FILTER (WHERE state IN ('ANSWERED', 'FAILED')) AS outcome_at,
        arg_min(metrics['queue_s'], time) FILTER (WHERE state = 'STARTED') AS queue_s,
        arg_max(metrics['latency_s'], time)
            FILTER (WHERE state IN ('ANSWERED', 'FAILED')) AS latency_s,
        arg_max(duration_s, time) FILTER (WHERE state IN ('ANSWERED', 'FAILED')) AS duration_s,
        arg_max(error_type, time) FILTER (WHERE state = 'FAILED') AS error_type,
        arg_max(error_message, time) FILTER (WHERE state = 'FAILED') AS error_message,
        max(trace_id) AS trace_id,
        max(node_id) AS node_id,
        max(time) AS last_event_at
    FROM events
    WHERE kind = 'request' AND task_id IS NOT NULL
    GROUP BY coalesce(run_id, ''), task_id
)
SELECT
    * EXCLUDE (outcome),
    CASE
        WHEN outcome IS NOT NULL AND (last_started_at IS NULL OR outcome_at >= last_started_at)
            THEN outcome
        WHEN last_started_at IS NOT NULL THEN 'STARTED'
        ELSE 'ENQUEUED'
    END AS state
FROM folded;
