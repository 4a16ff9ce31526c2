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
--   * ops of a run with no step at all form one group with step NULL.
-- No step row is ever made of such trailing ops alone. run_id is '' when ops carry none.
CREATE OR REPLACE VIEW op_steps AS
WITH keyed AS (
    SELECT *, coalesce(run_id, '') AS run_key FROM ops
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
    k.* EXCLUDE (run_id, run_key),
    k.run_key AS run_id,
    CASE
        WHEN k.step IS NULL THEN least(coalesce(s.step_then, b.first_step), b.last_step)
        WHEN k.step > b.last_step THEN b.last_step
        ELSE k.step
    END AS step_group
FROM keyed k
LEFT JOIN bounds b ON b.run_key = k.run_key
ASOF LEFT JOIN stepped s
    ON s.run_key = k.run_key AND coalesce(k.time, k.started_at) >= s.at;

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

CREATE OR REPLACE VIEW steps AS
WITH grouped AS (
    SELECT
        run_id,
        step_group AS step,
        count(*) AS ops,
        count(*) FILTER (WHERE state = 'FAILED') AS failures,
        coalesce(sum(duration_s), 0) AS seconds,
        min(started_at) AS started_at,
        max(coalesce(time, started_at)) AS ended_at,
        list_sort(list_distinct(list(name))) AS op_names
    FROM op_steps
    GROUP BY run_id, step_group
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

CREATE OR REPLACE VIEW runs AS
SELECT
    run_id,
    count(*) AS steps,
    sum(ops) AS ops,
    sum(failures) AS failures,
    sum(seconds) AS seconds,
    min(step) AS first_step,
    max(step) AS last_step,
    min(started_at) AS started_at,
    max(ended_at) AS ended_at
FROM steps
GROUP BY run_id;
