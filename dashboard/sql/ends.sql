-- Ends evagg infers for task attempts that were left open (docs/ray.md, "Ends readers
-- infer"). Ray's GCS fails the unfinished tasks of a job whose driver exited, and of a
-- worker or node that died, in its own table only: it exports the job's, the worker's and
-- the node's end, never those failures. A node that died with its agent exports nothing.
-- So `tasks` is `task_attempts` (tasks.sql, or the fold's) with an end put on every
-- attempt still open when one of these facts says it cannot be running any more:
--   * its driver job ended (Ray's FINISHED: Ray's tools call it SUCCEEDED); the job's
--     driver task itself reads FINISHED then;
--   * the worker it ran on died (matched by worker id, or by node and pid: the
--     executor's RUNNING event carries the pid, not the worker id);
--   * its node died (Ray's node DEAD);
--   * the agent of the node it ran on went silent (no heartbeat for its `silent_after_s`,
--     which the agent states in each heartbeat), in a Ray session no live agent still
--     reports (or for evagg's own tasks, which need that agent to report at all).
-- Each such end reads FAILED with Ray's error type (WORKER_DIED, NODE_DIED) and says in
-- `inferred` what evagg saw. It is put on at read time, so a real end that arrives later
-- (a late POST, an agent that catches up) wins as soon as it is stored.
-- The file runs whole for the views over the files; dashboard/lake/fold.py runs its sections
-- by name around the fold's own tables.

-- @macros
-- Per (session, kind, id) of Ray's driver jobs, workers and nodes: where it ran and when
-- it ended, as Ray exported it (real_end_at) or as an agent inferred it (inferred_end_at).
-- Every column merges by min/max/arg_min, so the fold keeps it file by file.
CREATE OR REPLACE MACRO ends_facts_of(rows) AS TABLE
SELECT session, kind, id, max(node_id) AS node_id, max(pid) AS pid, min(time) AS first_at,
       min(real_end) AS real_end_at, min(inferred_end) AS inferred_end_at,
       arg_min(inferred, inferred_end) AS inferred
FROM (
    SELECT coalesce(attrs['ray_session'], '') AS session, kind, time,
           CASE kind WHEN 'job' THEN job_id WHEN 'worker' THEN worker_id ELSE node_id END AS id,
           nullif(node_id, '') AS node_id,
           TRY_CAST(attrs['worker_pid'] AS INTEGER) AS pid,
           CASE WHEN state IN ('FINISHED', 'DEAD') AND attrs['evagg_inferred'] IS NULL
                THEN time END AS real_end,
           CASE WHEN state IN ('FINISHED', 'DEAD') AND attrs['evagg_inferred'] IS NOT NULL
                THEN time END AS inferred_end,
           attrs['evagg_inferred'] AS inferred
    FROM query_table(rows)
    WHERE kind IN ('job', 'worker', 'node')
)
WHERE coalesce(id, '') <> ''
GROUP BY ALL;
CREATE OR REPLACE MACRO ends_facts_merge_of(parts) AS TABLE
SELECT session, kind, id, max(node_id) AS node_id, max(pid) AS pid,
       min(first_at) AS first_at, min(real_end_at) AS real_end_at, min(inferred_end_at) AS inferred_end_at,
       arg_min(inferred, inferred_end_at) AS inferred
FROM query_table(parts)
GROUP BY ALL;
-- Per agent (its host): its last heartbeat, its state then, and how long it may be
-- silent before readers take it for dead (5 minutes for agents that do not say).
CREATE OR REPLACE MACRO ends_agents_of(rows) AS TABLE
SELECT host, max(time) AS last_at,
       arg_max(coalesce(TRY_CAST(attrs['silent_after_s'] AS DOUBLE), 300.0), time)
           AS silent_after_s,
       arg_max(state, time) AS state
FROM query_table(rows)
WHERE kind = 'agent' AND coalesce(host, '') <> ''
GROUP BY host;
CREATE OR REPLACE MACRO ends_agents_merge_of(parts) AS TABLE
SELECT host, max(last_at) AS last_at, arg_max(silent_after_s, last_at) AS silent_after_s,
       arg_max(state, last_at) AS state
FROM query_table(parts)
GROUP BY host;
-- Which agents received task events of which Ray session ('' for evagg's own tasks).
CREATE OR REPLACE MACRO ends_session_hosts_of(rows) AS TABLE
SELECT DISTINCT coalesce(attrs['ray_session'], '') AS session, host
FROM query_table(rows)
WHERE kind = 'task' AND coalesce(host, '') <> '';

-- @raw
-- The facts over every stored event (the fold keeps them in tables instead).
CREATE OR REPLACE VIEW ends_facts AS SELECT * FROM ends_facts_of('events_raw');
CREATE OR REPLACE VIEW ends_agents AS SELECT * FROM ends_agents_of('events_raw');
CREATE OR REPLACE VIEW ends_session_hosts AS SELECT * FROM ends_session_hosts_of('events_raw');

-- @overlay
-- Each agent's last word and whether it has been silent too long; each session (Ray's,
-- or '' for evagg's own tasks) ended when every agent that received its tasks is silent.
CREATE OR REPLACE VIEW agent_liveness AS
SELECT host, last_at, silent_after_s, state,
       last_at < now() - to_microseconds(CAST(silent_after_s * 1e6 AS BIGINT)) AS silent
FROM ends_agents;
CREATE OR REPLACE VIEW session_liveness AS
SELECT s.session, bool_and(a.silent) AS ended, max(a.last_at) AS last_heard_at
FROM ends_session_hosts AS s JOIN agent_liveness AS a USING (host)
GROUP BY s.session;
-- A driver job ends with its driver: Ray exports the driver task's end (when the driver
-- exited cleanly) more often than the job's FINISHED (docs/ray.md, Known gaps), so each
-- job's facts take the earlier of the two: no task of the job outlives its driver, and
-- the tasks left open are ended there. (The `jobs` view below says when the job itself
-- ended, as Ray's job table does: its own exported end first.)
CREATE OR REPLACE VIEW driver_ends AS
SELECT session, job_id, min(coalesce(finished_at, failed_at)) AS ended_at
FROM task_attempts
WHERE coalesce(task_type, '') = 'DRIVER_TASK' AND final_state IN ('FINISHED', 'FAILED')
    AND coalesce(job_id, '') <> '' AND inferred IS NULL
GROUP BY ALL;
CREATE OR REPLACE VIEW job_facts AS
SELECT f.* REPLACE (least(f.real_end_at, d.ended_at) AS real_end_at)
FROM ends_facts AS f
LEFT JOIN driver_ends AS d ON f.kind = 'job' AND d.session = f.session AND d.job_id = f.id
UNION ALL BY NAME
SELECT d.session, 'job' AS kind, d.job_id AS id, d.ended_at AS real_end_at
FROM driver_ends AS d
ANTI JOIN ends_facts AS f ON f.kind = 'job' AND f.session = d.session AND f.id = d.job_id;

-- Ray's export takes a few seconds after the fact it follows (Ray flushes every second,
-- its aggregator posts in batches): an end is put on only once that long has passed, so
-- an attempt whose real end is on its way does not flicker to FAILED in between.
CREATE OR REPLACE VIEW task_ends AS
WITH open AS (
    SELECT task_id, attempt, session, job_id, node_id, worker_id, pid, host, running_at,
           first_seen, coalesce(task_type, '') = 'DRIVER_TASK' AS driver
    FROM task_attempts
    WHERE final_state NOT IN ('FINISHED', 'FAILED')
),
facts AS (
    SELECT *, coalesce(real_end_at, inferred_end_at) AS end_at,
           CASE WHEN real_end_at IS NULL THEN inferred END AS end_inferred
    FROM job_facts
    WHERE coalesce(real_end_at, inferred_end_at) < now() - INTERVAL 5 SECOND
),
silent AS (SELECT host, last_at, silent_after_s FROM agent_liveness WHERE silent),
live_sessions AS (SELECT session FROM session_liveness WHERE NOT ended),
candidates AS (
    SELECT o.task_id, o.attempt, o.session, f.end_at,
           CASE WHEN o.driver THEN 'FINISHED' ELSE 'FAILED' END AS final_state,
           CASE WHEN NOT o.driver THEN 'WORKER_DIED' END AS error_type,
           CASE WHEN o.driver THEN NULL WHEN o.running_at IS NULL
                THEN 'Job finishes (' || o.job_id || ') as driver exits. '
                     || 'Marking all non-terminal tasks as failed.'
                ELSE 'The worker running the task was ended with its job ' || o.job_id
                     || ': the driver exited.' END AS error_message,
           'evagg inferred this end: job ' || o.job_id || ' ended at '
               || strftime(f.end_at, '%Y-%m-%dT%H:%M:%S.%gZ')
               || coalesce(' (' || f.end_inferred || ')', ' (Ray exported the job''s end)')
               || ' and no end of this attempt was exported' AS inferred
    FROM open AS o JOIN facts AS f
        ON f.kind = 'job' AND f.session = o.session AND f.id = o.job_id
    UNION ALL
    SELECT o.task_id, o.attempt, o.session, f.end_at, 'FAILED', 'WORKER_DIED',
           'The worker running the task died (worker ' || f.id || coalesce(', pid ' || f.pid, '')
               || ').',
           'evagg inferred this end: the worker ' || f.id || ' died at '
               || strftime(f.end_at, '%Y-%m-%dT%H:%M:%S.%gZ')
               || coalesce(' (' || f.end_inferred || ')', ' (Ray exported its death)')
               || ' and no end of this attempt was exported'
    FROM open AS o JOIN facts AS f
        ON f.kind = 'worker' AND f.session = o.session AND f.id = o.worker_id
    WHERE o.running_at IS NOT NULL
    UNION ALL
    SELECT o.task_id, o.attempt, o.session, f.end_at, 'FAILED', 'WORKER_DIED',
           'The worker running the task died (worker ' || f.id || ', pid ' || f.pid || ').',
           'evagg inferred this end: the worker ' || f.id || ' (pid ' || f.pid || ') died at '
               || strftime(f.end_at, '%Y-%m-%dT%H:%M:%S.%gZ')
               || coalesce(' (' || f.end_inferred || ')', ' (Ray exported its death)')
               || ' and no end of this attempt was exported'
    FROM open AS o JOIN facts AS f
        ON f.kind = 'worker' AND f.session = o.session AND f.node_id = o.node_id
        AND f.pid = o.pid
    WHERE o.running_at IS NOT NULL AND coalesce(o.worker_id, '') = ''
    UNION ALL
    SELECT o.task_id, o.attempt, o.session, f.end_at, 'FAILED', 'NODE_DIED',
           'The node running the task died (node ' || f.id || ').',
           'evagg inferred this end: the node ' || f.id || ' died at '
               || strftime(f.end_at, '%Y-%m-%dT%H:%M:%S.%gZ')
               || coalesce(' (' || f.end_inferred || ')', ' (Ray exported its death)')
               || ' and no end of this attempt was exported'
    FROM open AS o JOIN facts AS f
        ON f.kind = 'node' AND f.session = o.session AND f.id = o.node_id
    UNION ALL
    SELECT o.task_id, o.attempt, o.session, s.last_at, 'FAILED', 'NODE_DIED',
           'The node running the task stopped reporting (its evagg agent on ' || o.host
               || ' fell silent).',
           'evagg inferred this end: the agent on ' || o.host || ' last reported at '
               || strftime(s.last_at, '%Y-%m-%dT%H:%M:%S.%gZ') || ' and has been silent for over '
               || CAST(CAST(s.silent_after_s AS BIGINT) AS VARCHAR) || ' s; the attempt is taken '
               || 'to have ended with its node'
    FROM open AS o JOIN silent AS s ON s.host = o.host
    WHERE o.session = '' OR o.session NOT IN (SELECT session FROM live_sessions)
)
SELECT DISTINCT ON (c.task_id, c.attempt, c.session)
    c.task_id, c.attempt, c.session,
    greatest(c.end_at, coalesce(o.running_at, o.first_seen)) AS end_at,
    c.final_state, c.error_type, c.error_message, c.inferred
FROM candidates AS c JOIN open AS o USING (task_id, attempt, session)
ORDER BY c.task_id, c.attempt, c.session, c.end_at;

-- tasks: one row per task attempt (tasks.sql's columns and `inferred`, which says how
-- evagg knows of an end nobody reported; NULL for every reported end).
CREATE OR REPLACE VIEW tasks AS
SELECT a.* EXCLUDE (session) REPLACE (
    coalesce(e.final_state, a.final_state) AS final_state,
    CASE WHEN e.final_state = 'FINISHED' THEN e.end_at ELSE a.finished_at END AS finished_at,
    CASE WHEN e.final_state = 'FAILED' THEN e.end_at ELSE a.failed_at END AS failed_at,
    CASE WHEN e.end_at IS NULL THEN a.duration_s
         ELSE (epoch_us(e.end_at) - epoch_us(a.running_at)) / 1e6 END AS duration_s,
    coalesce(e.error_type, a.error_type) AS error_type,
    coalesce(e.error_message, a.error_message) AS error_message,
    coalesce(e.inferred, a.inferred) AS inferred
)
FROM task_attempts AS a
LEFT JOIN task_ends AS e
    ON e.task_id = a.task_id AND e.attempt = a.attempt AND e.session = a.session;

-- Ray's driver jobs: when each started and ended, and how evagg knows of the end (Ray
-- exported it; an agent inferred it; or no agent of its session reports any more).
-- The job's own exported end is the one Ray's job table holds; its driver task's end,
-- a moment earlier, stands in only where the job's was not exported.
-- `evagg query jobs` prints it; Ray's `ray list jobs` against the dashboard says the same.
CREATE OR REPLACE VIEW jobs AS
SELECT f.id AS job_id, nullif(f.session, '') AS ray_session, f.first_at AS started_at,
       coalesce(f.real_end_at, d.ended_at, f.inferred_end_at,
                CASE WHEN s.ended THEN s.last_heard_at END) AS ended_at,
       CASE WHEN coalesce(f.real_end_at, d.ended_at, f.inferred_end_at) IS NOT NULL
                 OR s.ended
            THEN 'SUCCEEDED' ELSE 'RUNNING' END AS status,
       CASE WHEN f.real_end_at IS NOT NULL THEN 'exported by Ray'
            WHEN d.ended_at IS NOT NULL THEN 'its driver task''s end, exported by Ray'
            WHEN f.inferred_end_at IS NOT NULL THEN f.inferred
            WHEN s.ended THEN 'evagg inferred this end: no agent of this Ray session has '
                              || 'reported since ' || strftime(s.last_heard_at,
                                                               '%Y-%m-%dT%H:%M:%SZ')
       END AS how_known
FROM ends_facts AS f LEFT JOIN session_liveness AS s USING (session)
LEFT JOIN driver_ends AS d ON d.session = f.session AND d.job_id = f.id
WHERE f.kind = 'job';
