-- Training steps: ops grouped by (run_id, step).
--
-- The step rule. A run's last step is the highest step of its optimizer ops (an op
-- whose name contains "optim" or is a train step: "optimizer.step", "train_step"); a
-- run without such ops uses its highest op step. Then:
--   * an op with a step beyond the last step (a final save numbered last + 1) joins
--     the last step;
--   * an op without a step joins the step in effect when it ran: the step of the
--     latest stepped op at or before its time (the first step if it ran before any);
--     so a final save with no step joins the last step;
--   * ops of a run with no step at all form one group with step NULL;
--   * an op without a step that encloses steps (the method that runs the whole loop,
--     traced as one op: from before a step began to after the next one began) counts in
--     no step: it is the steps' parent, not a part of the last one's time.
-- No step row is ever made of such trailing ops alone. run_id is '' when ops carry none.
CREATE OR REPLACE VIEW op_steps AS
WITH keyed AS (
    SELECT *, coalesce(run_id, '') AS run_key,
           greatest(coalesce(time, started_at),
                    started_at + to_microseconds(CAST(coalesce(duration_s, 0) * 1e6 AS BIGINT)))
               AS ended_at
    FROM ops
),
bounds AS (
    SELECT
        run_key,
        coalesce(
            max(step) FILTER (WHERE regexp_matches(lower(name), 'optim|train[_.-]?step')),
            max(step)
        ) AS last_step,
        min(step) AS first_step
    FROM keyed
    WHERE step IS NOT NULL
    GROUP BY run_key
),
stepped AS (
    SELECT run_key, step AS step_then, coalesce(time, started_at) AS at
    FROM keyed WHERE step IS NOT NULL
)
SELECT
    k.* EXCLUDE (run_id, run_key, ended_at),
    k.run_key AS run_id,
    CASE
        WHEN k.step IS NULL THEN least(coalesce(s.step_then, b.first_step), b.last_step)
        WHEN k.step > b.last_step THEN b.last_step
        ELSE k.step
    END AS step_group
FROM keyed k
LEFT JOIN bounds b ON b.run_key = k.run_key
ASOF LEFT JOIN stepped s
    ON s.run_key = k.run_key AND coalesce(k.time, k.started_at) >= s.at
ASOF LEFT JOIN stepped f  -- the steps in effect when it began and when it ended
    ON f.run_key = k.run_key AND k.started_at >= f.at
ASOF LEFT JOIN stepped e
    ON e.run_key = k.run_key AND k.ended_at >= e.at
WHERE k.step IS NOT NULL OR k.started_at IS NULL
   OR coalesce(coalesce(e.step_then, b.first_step) - coalesce(f.step_then, b.first_step - 1)
               < 2, true);  -- a run without steps: none to enclose

-- One row per (run, metric name, step): the spread of that metric over the step's ops.
CREATE OR REPLACE VIEW step_metrics AS
SELECT
    run_id,
    step_group AS step,
    entry.key AS metric,
    count(*) AS n,
    min(entry.value) AS min,
    max(entry.value) AS max,
    avg(entry.value) AS mean
FROM (SELECT run_id, step_group, unnest(map_entries(metrics)) AS entry
      FROM op_steps WHERE metrics IS NOT NULL)
GROUP BY run_id, step_group, entry.key;

-- A step's seconds: the wall time its ops cover, each moment counted once (the union of
-- their intervals), so forward, backward and optimizer_step inside train_step, or an op
-- nested in another, add nothing to the step that spans them. An op's interval runs from
-- its start to its end, or to start + duration_s when its only event is stamped at its
-- start (the torch tracker's, OpenTelemetry's). Intervals that touch or overlap merge.
-- queue_s: the time the step's work waited in a queue before it started (the ops'
-- metrics.queue_s from emitters.queueing.start_work, summed); NULL when none was queued.
CREATE OR REPLACE VIEW step_intervals AS
WITH bounds AS (
    SELECT run_id, step_group, epoch_ns(started_at) AS lo,
           greatest(epoch_ns(coalesce(time, started_at)),
                    epoch_ns(started_at) + CAST(coalesce(duration_s, 0) * 1e9 AS BIGINT)) AS hi
    FROM op_steps
    WHERE started_at IS NOT NULL
),
reach AS (
    SELECT *, max(hi) OVER (PARTITION BY run_id, step_group ORDER BY lo, hi
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM bounds
),
islands AS (
    SELECT *, sum(CASE WHEN reached IS NULL OR lo > reached THEN 1 ELSE 0 END)
                  OVER (PARTITION BY run_id, step_group ORDER BY lo, hi
                        ROWS UNBOUNDED PRECEDING) AS island
    FROM reach
)
SELECT run_id, step_group, sum(hi - lo) / 1e9 AS seconds
FROM (SELECT run_id, step_group, island, min(lo) AS lo, max(hi) AS hi
      FROM islands GROUP BY run_id, step_group, island)
GROUP BY run_id, step_group;

CREATE OR REPLACE VIEW steps AS
WITH counted AS (
    SELECT
        run_id,
        step_group AS step,
        count(*) AS ops,
        count(*) FILTER (WHERE state = 'FAILED') AS failures,
        sum(metrics['queue_s']) AS queue_s,
        min(started_at) AS started_at,
        max(coalesce(time, started_at)) AS ended_at,
        list_sort(list_distinct(list(name))) AS op_names
    FROM op_steps
    GROUP BY run_id, step_group
),
grouped AS (
    SELECT c.run_id, c.step, c.ops, c.failures, coalesce(w.seconds, 0) AS seconds,
           c.queue_s, c.started_at, c.ended_at, c.op_names
    FROM counted c
    LEFT JOIN step_intervals w
        ON w.run_id = c.run_id AND w.step_group IS NOT DISTINCT FROM c.step
),
spread AS (
    SELECT run_id, step,
           map_from_entries(list({'key': metric,
                                  'value': {'min': min, 'max': max, 'mean': mean}}
                                 ORDER BY metric)) AS metrics
    FROM step_metrics
    GROUP BY run_id, step
)
SELECT g.*, s.metrics
FROM grouped g
LEFT JOIN spread s ON s.run_id = g.run_id AND s.step IS NOT DISTINCT FROM g.step;

-- The files the agents shipped for each run (`artifact` events, aggregator/artifacts/):
-- a run that sent only files (a profiler's traces without a tracker) is a run too.
CREATE OR REPLACE VIEW run_files AS
SELECT run_id, count(DISTINCT (node_id, name)) AS files,
       min(time) AS first_file_at, max(time) AS last_file_at
FROM events
WHERE kind = 'artifact' AND run_id <> ''
GROUP BY run_id;

CREATE OR REPLACE VIEW runs AS
WITH by_steps AS (
    SELECT
        run_id,
        count(*) AS steps,
        sum(ops) AS ops,
        sum(failures) AS failures,
        sum(seconds) AS seconds,
        sum(queue_s) AS queue_s,
        min(step) AS first_step,
        max(step) AS last_step,
        min(started_at) AS started_at,
        max(ended_at) AS ended_at
    FROM steps
    GROUP BY run_id
)
SELECT
    coalesce(s.run_id, f.run_id) AS run_id,
    coalesce(s.steps, 0) AS steps,
    coalesce(s.ops, 0) AS ops,
    coalesce(s.failures, 0) AS failures,
    s.seconds, s.queue_s, s.first_step, s.last_step,
    coalesce(s.started_at, f.first_file_at) AS started_at,
    coalesce(s.ended_at, f.last_file_at) AS ended_at,
    coalesce(f.files, 0) AS files
FROM by_steps s
FULL JOIN run_files f ON f.run_id = s.run_id;
