-- task_attempts: one row per task attempt, folded from every kind = 'task' event in
-- `events_raw` (ends.sql's `tasks` is this with the ends evagg infers put on)
-- (evagg's own task events and Ray's). Needs a view or table `events_raw` with the evagg
-- columns. It reads the raw rows, not the deduplicated `events`, because every aggregate
-- below is already duplicate-proof and skipping the dedupe makes the view ~4x faster.
--
-- Ray splits one attempt over several events that arrive out of order and possibly in
-- different POSTs: the definition (state DEFINED, the only one with the task's name),
-- the owner's PENDING/SUBMITTED/FINISHED/FAILED (with the executor's node and worker
-- and the error) and the executor's RUNNING (with the worker's pid in
-- attrs['worker_pid']). So every column is an order-free aggregate:
--   * the time of a state is the earliest event in it;
--   * final_state is the state of highest rank (DEFINED < PENDING < SUBMITTED <
--     RUNNING < an end an agent inferred < FINISHED = FAILED), then the latest, then
--     FAILED over FINISHED: a RUNNING that arrives after FINISHED changes nothing; a
--     real end that arrives after an inferred one (attrs evagg_inferred) wins; a task
--     whose RUNNING never arrived still has its row;
--   * node_id prefers the RUNNING event (reported by the executor on its node), then
--     the terminal one; worker_id prefers the terminal event (the executor's RUNNING
--     event carries none);
--   * the error columns come together from the latest event that has an error;
--   * duration_s is the latest terminal event's own duration_s when it reports one
--     (what the producer measured wins), else finished/failed minus running.
-- A task event without a task_id is a task of its own: one attempt keyed by its
-- event_id (task_id shows the event_id), so `emit(kind="task", name=..., state="FINISHED",
-- duration_s=...)` is a complete row. An attempt with no name (Ray exports a restarted
-- actor creation task's RUNNING without its definition) takes the name of another
-- attempt of the same task, else the function Ray named there, else the actor's repr.
-- An attempt made only of events with neither a state nor a name (a Ray lifecycle event
-- without a state transition, sent before its first transition) is no row: it said
-- nothing about the task yet.
-- Every aggregate ignores duplicate rows (count is DISTINCT), so resent events change
-- nothing. Ray tasks are also keyed by attrs['ray_session']: a new Ray cluster starts
-- its job and task ids again from the same values.
CREATE OR REPLACE MACRO task_state_rank(state, inferred) AS
    CASE state
        WHEN 'DEFINED' THEN 0
        WHEN 'PENDING' THEN 2
        WHEN 'SUBMITTED' THEN 4
        WHEN 'RUNNING' THEN 6
        WHEN 'FINISHED' THEN CASE WHEN inferred IS NULL THEN 8 ELSE 7 END
        WHEN 'FAILED' THEN CASE WHEN inferred IS NULL THEN 8 ELSE 7 END
    END;
CREATE OR REPLACE VIEW task_attempts AS
WITH task_events AS (
    SELECT
        * REPLACE (coalesce(nullif(task_id, ''), event_id) AS task_id),
        coalesce(attempt, 0) AS attempt_no,
        coalesce(attrs['ray_session'], '') AS session,
        task_state_rank(state, attrs['evagg_inferred']) AS state_rank,
        attrs['evagg_inferred'] IS NOT NULL AS inferred_event
    FROM events_raw
    WHERE kind = 'task' AND coalesce(nullif(task_id, ''), event_id) IS NOT NULL
),
folded AS (
    SELECT
        task_id,
        attempt_no AS attempt,
        session,
        arg_max(name, {'defined': coalesce(state = 'DEFINED', false), 'time': time})
            FILTER (WHERE coalesce(name, '') <> '') AS name,
        arg_max(state, {'rank': state_rank, 'time': time, 'failed': state = 'FAILED'})
            FILTER (WHERE state_rank IS NOT NULL) AS final_state,
        max(state_rank) AS final_rank,
        min(time) FILTER (WHERE state = 'PENDING') AS pending_at,
        min(time) FILTER (WHERE state = 'SUBMITTED') AS submitted_at,
        min(time) FILTER (WHERE state = 'RUNNING') AS running_at,
        min(time) FILTER (WHERE state = 'FINISHED' AND NOT inferred_event) AS finished_at,
        min(time) FILTER (WHERE state = 'FAILED' AND NOT inferred_event) AS failed_at,
        min(time) FILTER (WHERE state_rank = 7) AS inferred_at,
        arg_min(attrs['evagg_inferred'], time) FILTER (WHERE state_rank = 7) AS inferred,
        arg_max(duration_s, time)
            FILTER (WHERE state_rank = 8 AND duration_s IS NOT NULL) AS reported_s,
        max(job_id) FILTER (WHERE job_id <> '') AS job_id,
        arg_max(node_id, {'pref': CASE WHEN state = 'RUNNING' THEN 2 WHEN state_rank = 8
                                       THEN 1 ELSE 0 END, 'time': time})
            FILTER (WHERE node_id <> '') AS node_id,
        arg_max(host, {'pref': CASE WHEN state = 'RUNNING' THEN 2 WHEN state_rank = 8
                                    THEN 1 ELSE 0 END, 'time': time})
            FILTER (WHERE host <> '') AS host,
        arg_max(worker_id, {'pref': CASE WHEN state_rank = 8 THEN 2 WHEN state = 'RUNNING'
                                         THEN 1 ELSE 0 END, 'time': time})
            FILTER (WHERE worker_id <> '') AS worker_id,
        coalesce(max(TRY_CAST(attrs['worker_pid'] AS INTEGER)),
                 max(pid) FILTER (WHERE state = 'RUNNING'), max(pid)) AS pid,
        max(actor_id) FILTER (WHERE actor_id <> '') AS actor_id,
        max(parent_id) FILTER (WHERE parent_id <> '') AS parent_id,
        max(trace_id) FILTER (WHERE trace_id <> '') AS trace_id,
        max(attrs['ray_task_type']) AS task_type,
        max(attrs['ray_function']) AS function,
        max(attrs['ray_actor_repr_name']) AS actor_repr,
        bool_or(coalesce(state, '') <> '') AS has_state,
        arg_max({'error_type': error_type, 'exception_class': attrs['exception_class'],
                 'error_message': error_message, 'stack_trace': stack_trace},
                {'real': NOT inferred_event, 'time': time})
            FILTER (WHERE error_type IS NOT NULL OR error_message IS NOT NULL) AS error,
        bool_and(inferred_event)
            FILTER (WHERE error_type IS NOT NULL OR error_message IS NOT NULL) AS error_inferred,
        max(source) AS source,
        min(time) AS first_seen,
        max(time) AS last_seen,
        count(DISTINCT event_id) AS events
    FROM task_events
    GROUP BY task_id, attempt_no, session
),
said AS (
    SELECT *, coalesce(final_rank = 7, false) AS final_inferred,
           -- an inferred end's error is not shown once a real end won
           NOT coalesce(error_inferred AND final_rank <> 7, false) AS shown
    FROM folded WHERE has_state OR name IS NOT NULL
)
SELECT
    task_id,
    attempt,
    coalesce(name, max(name) OVER task, max(function) OVER task, actor_repr) AS name,
    coalesce(final_state, 'UNKNOWN') AS final_state,
    pending_at,
    submitted_at,
    running_at,
    CASE WHEN final_state = 'FINISHED' THEN coalesce(finished_at, inferred_at)
         ELSE finished_at END AS finished_at,
    CASE WHEN final_state = 'FAILED' THEN coalesce(failed_at, inferred_at)
         ELSE failed_at END AS failed_at,
    coalesce(
        reported_s,
        (epoch_us(CASE final_state
                      WHEN 'FAILED' THEN coalesce(failed_at, inferred_at)
                      ELSE coalesce(finished_at, inferred_at) END)
            - epoch_us(running_at)) / 1e6
    ) AS duration_s,
    job_id,
    node_id,
    worker_id,
    pid,
    actor_id,
    parent_id,
    trace_id,
    CASE WHEN shown THEN error.error_type END AS error_type,
    CASE WHEN shown THEN error.exception_class END AS exception_class,
    CASE WHEN shown THEN error.error_message END AS error_message,
    CASE WHEN shown THEN error.stack_trace END AS stack_trace,
    source,
    task_type,
    function,
    nullif(session, '') AS ray_session,
    first_seen,
    last_seen,
    events,
    CASE WHEN final_inferred THEN inferred END AS inferred,
    host,
    session
FROM said
WINDOW task AS (PARTITION BY task_id, session);

-- tasks as folded; ends.sql (run after this file by the views) replaces it with the
-- ends evagg infers put on. A reader that loads only this file gets every reported end.
CREATE OR REPLACE VIEW tasks AS SELECT * EXCLUDE (session) FROM task_attempts;
