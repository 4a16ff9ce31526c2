-- Task summaries: state counts and duration quantiles (seconds) per value of one
-- dimension. `duration_bins` is a histogram over fixed quarter-decade bins from 1 us:
-- bin b holds durations in [10^(b/4 - 6), 10^((b+1)/4 - 6)) s; bin 0 also holds
-- anything shorter and bin 39 (about 94 min and up) anything longer, so rows and pages
-- share one scale, and tasks of a few microseconds land in bins of their own.
CREATE OR REPLACE MACRO duration_bin(d) AS
    CAST(greatest(0, least(39, floor((log10(greatest(d, 1e-6)) + 6) * 4))) AS INTEGER);

-- What the summaries count, as Ray's own summary counts: every attempt but Ray's driver
-- task (the `driver` dimension of task_summary holds those, by job); a failure's error is
-- its exception class where Ray parsed one from its traceback (ValueError, not Ray's
-- TASK_EXECUTION_EXCEPTION, which stays in the tasks view's error_type); a job is its
-- job_key (keys.sql: a Ray job at its session). The error dimension counts every task
-- with an error and every failure, one without an error under NULL ("no error type"), so
-- that its rows add up to the failures.
CREATE OR REPLACE VIEW counted_tasks AS
SELECT *, coalesce(exception_class, error_type) AS error, job_key(job_id, ray_session) AS job,
       error IS NOT NULL OR final_state = 'FAILED' AS erred
FROM tasks
WHERE coalesce(task_type, '') <> 'DRIVER_TASK';
CREATE OR REPLACE VIEW erred_tasks AS SELECT * FROM counted_tasks WHERE erred;

-- Quantiles are exact (quantile_cont, interpolated); asking for the three in one list
-- sorts each group once instead of three times. max_s, mean_s and duration_bins leave
-- `*` and come back after the quantiles, so each column appears once.
CREATE OR REPLACE MACRO task_stats_by(dim, counted := 'counted_tasks') AS TABLE
SELECT * EXCLUDE (q, max_s, mean_s, duration_bins),
       q[1] AS p50_s, q[2] AS p90_s, q[3] AS p99_s, max_s, mean_s, duration_bins
FROM (
    SELECT
        dim AS value,
        count(*) AS tasks,
        count(*) FILTER (WHERE final_state = 'PENDING') AS pending,
        count(*) FILTER (WHERE final_state = 'SUBMITTED') AS submitted,
        count(*) FILTER (WHERE final_state = 'RUNNING') AS running,
        count(*) FILTER (WHERE final_state = 'FINISHED') AS finished,
        count(*) FILTER (WHERE final_state = 'FAILED') AS failed,
        quantile_cont(duration_s, [0.5, 0.9, 0.99]) AS q,
        max(duration_s) AS max_s,
        avg(duration_s) AS mean_s,
        histogram(duration_bin(duration_s)) FILTER (WHERE duration_s IS NOT NULL)
            AS duration_bins
    FROM query_table(counted)
    GROUP BY dim
);

CREATE OR REPLACE VIEW summary_by_state AS SELECT * FROM task_stats_by(final_state);
CREATE OR REPLACE VIEW summary_by_name AS SELECT * FROM task_stats_by(name);
CREATE OR REPLACE VIEW summary_by_job AS SELECT * FROM task_stats_by(job);
CREATE OR REPLACE VIEW summary_by_node AS SELECT * FROM task_stats_by(node_id);
CREATE OR REPLACE VIEW summary_by_error AS
SELECT * FROM task_stats_by(error, counted := 'erred_tasks');

-- All dimensions in one pass over `tasks` (what `evagg query summary` prints): the
-- fold of task events runs once instead of once per dimension.
CREATE OR REPLACE VIEW task_summary AS
SELECT * EXCLUDE (q, max_s), q[1] AS p50_s, q[2] AS p90_s, q[3] AS p99_s, max_s FROM (
SELECT
    CASE
        WHEN grouping(final_state) = 0 THEN 'state'
        WHEN grouping(name) = 0 THEN 'name'
        WHEN grouping(error) = 0 THEN 'error_type'
        WHEN grouping(job) = 0 THEN 'job'
        WHEN grouping(node_id) = 0 THEN 'node'
        ELSE 'all'
    END AS dimension,
    coalesce(final_state, name, error, job, node_id) AS value,
    count(*) AS tasks,
    count(*) FILTER (WHERE final_state = 'FINISHED') AS finished,
    count(*) FILTER (WHERE final_state = 'FAILED') AS failed,
    count(*) FILTER (WHERE final_state NOT IN ('FINISHED', 'FAILED')) AS unfinished,
    quantile_cont(duration_s, [0.5, 0.9, 0.99]) AS q,
    max(duration_s) AS max_s
FROM counted_tasks
GROUP BY GROUPING SETS ((), (final_state), (name), (erred, error), (job), (node_id))
HAVING grouping(error) = 1 OR erred
UNION ALL
SELECT 'driver', job_key(job_id, ray_session), count(*),
    count(*) FILTER (WHERE final_state = 'FINISHED'),
    count(*) FILTER (WHERE final_state = 'FAILED'),
    count(*) FILTER (WHERE final_state NOT IN ('FINISHED', 'FAILED')),
    quantile_cont(duration_s, [0.5, 0.9, 0.99]), max(duration_s)
FROM tasks WHERE task_type = 'DRIVER_TASK'
GROUP BY ALL
);
