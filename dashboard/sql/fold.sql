-- The incremental task fold (dashboard/lake/fold.py), not a view file: dashboard/lake/views.py
-- skips it. Each "-- @name" starts a statement group that fold.py runs by name. The
-- tables live in the attached database `fold` (a cache file, or memory).
--
-- task_fold holds, per (task_id, attempt, session), the *state* of every aggregate of
-- tasks.sql in a mergeable form: a min or max stays itself; an arg_max keeps its value
-- and the key it won with, so folding more rows (or the same rows again) is arg_max over
-- the union of keys. Folding is therefore order-free and idempotent per row: refolding
-- a file, or a compacted file holding rows already folded, changes nothing. The one
-- count, count(DISTINCT event_id), is kept exact by `seen`: the 64-bit hashes of every
-- (event_id, kind) already counted, so only new events add to `events` and `timeline`.
--
-- On a local lake the task fragments are read where they are (dashboard/lake/fold_place.py
-- names them in `fold.placed` and binds the views `fold_placed` and `fold_tasks` over
-- them): task_fold then holds only the attempts that had to be merged (found in two
-- fragments, or touched by a later file), and every reader reads `fold_tasks`, the
-- stored rows and the in-place rows whose key no stored row has. Their compacted files'
-- timeline is read in place with them (`fold_timeline_all`), and counted into `timeline`
-- when they are copied (@persist). On S3 the fragments are copied into task_fold, and the
-- timeline counted, at once (reading them in place would download them on every query).

-- @schema
CREATE TABLE IF NOT EXISTS fold.meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS fold.files (path VARCHAR, size BIGINT);
CREATE TABLE IF NOT EXISTS fold.covers (path VARCHAR, name VARCHAR, size BIGINT);
-- The folded files whose tasks came from their task fragment, not their rows (fold.py).
CREATE TABLE IF NOT EXISTS fold.from_fragments (path VARCHAR);
-- The fragments read in place (a local lake), with their size and their compacted file.
CREATE TABLE IF NOT EXISTS fold.placed (fragment VARCHAR, size BIGINT, path VARCHAR);
CREATE TABLE IF NOT EXISTS fold.seen (t BIGINT, h UBIGINT);
CREATE TABLE IF NOT EXISTS fold.timeline (
    second BIGINT, kind VARCHAR, events BIGINT, first_us BIGINT, last_us BIGINT);
CREATE TABLE IF NOT EXISTS fold.task_fold AS
SELECT * FROM fold_finish_of('fold_empty_partial') LIMIT 0;
CREATE TABLE IF NOT EXISTS fold.summary_bins AS
SELECT * FROM fold_bins_of('fold_empty_signed') LIMIT 0;
-- The facts that end open attempts (dashboard/sql/ends.sql), kept as they merge.
CREATE TABLE IF NOT EXISTS fold.ends_facts AS SELECT * FROM ends_facts_of('fold_empty') LIMIT 0;
CREATE TABLE IF NOT EXISTS fold.ends_agents AS SELECT * FROM ends_agents_of('fold_empty') LIMIT 0;
CREATE TABLE IF NOT EXISTS fold.ends_session_hosts AS
SELECT * FROM ends_session_hosts_of('fold_empty') LIMIT 0;

-- @drop
DROP TABLE IF EXISTS fold.meta;
DROP TABLE IF EXISTS fold.files;
DROP TABLE IF EXISTS fold.covers;
DROP TABLE IF EXISTS fold.from_fragments;
DROP TABLE IF EXISTS fold.placed;
DROP TABLE IF EXISTS fold.seen;
DROP TABLE IF EXISTS fold.timeline;
DROP TABLE IF EXISTS fold.task_fold;
DROP TABLE IF EXISTS fold.summary;
DROP TABLE IF EXISTS fold.summary_bins;
DROP TABLE IF EXISTS fold.ends_facts;
DROP TABLE IF EXISTS fold.ends_agents;
DROP TABLE IF EXISTS fold.ends_session_hosts;

-- @shared
-- Made once on the connection, not per cursor: the views over the fragments read in
-- place (fold_place.py) use them, and every cursor reads those views.
-- tasks.sql's duration, kept with each row, and its histogram bin: bins are monotonic in
-- the duration (DuckDB's order: -inf < finite < +inf < NaN), about 0.4% wide, so the
-- summary finds a quantile's bin from counts and reads only that bin's durations.
CREATE OR REPLACE MACRO fold_bin(d) AS
    CASE
        WHEN d IS NULL THEN NULL
        WHEN isnan(d) OR d = CAST('infinity' AS DOUBLE) THEN 1000000
        WHEN d = CAST('-infinity' AS DOUBLE) THEN -1000000
        ELSE CAST(sign(d) * floor(ln(1 + abs(d) * 1e6) * 256) AS INTEGER)
    END;
-- Each stored row also keeps k, a hash of its key: the merge finds the rows a batch
-- touches by k alone (reading one integer column, not three), and regroups the rows
-- found by the whole key, so a row found by a colliding k is merged with itself alone.
CREATE OR REPLACE MACRO fold_finish_of(rows) AS TABLE
SELECT * EXCLUDE (d), d AS duration_s, fold_bin(d) AS bin,
       hash(task_id, attempt, session) AS k
FROM (
    SELECT *, coalesce(
        reported_s,
        (epoch_us(CASE final_state WHEN 'FAILED' THEN coalesce(failed_at, inferred_at)
                  ELSE coalesce(finished_at, inferred_at) END)
            - epoch_us(running_at)) / 1e6) AS d
    FROM query_table(rows));
-- Events per second and kind of `kinds` (kind, time: rows of compacted files, one per
-- event), as fold.timeline keeps them: @kinds_timeline adds them to it, and the view
-- fold_timeline_all (fold_place.py) adds those of the files it has not counted yet.
CREATE OR REPLACE MACRO fold_timeline_of(kinds) AS TABLE
SELECT epoch_us(time) // 1000000 AS second, kind, count(*) AS events,
       min(epoch_us(time)) AS first_us, max(epoch_us(time)) AS last_us
FROM query_table(kinds) GROUP BY ALL;

-- @macros
-- fold_partial_of(rows) and fold_merge_of(parts), the partial fold of task rows and the
-- merge of partial rows, are sinks/fragments/task_fold.py's (the one owner of the fold,
-- which the agent's task fragments are made with too): dashboard/lake/fold.py defines
-- them before these. `events` counts rows with an event_id; @batch takes away copies
-- and rows counted before.
-- Whether a row's error is shown: an inferred end's error is not, once a real end won.
-- (error_key's top bit says the error came from a real event; final_key // 2^56 is the
-- winning state's rank, 7 for an inferred end.)
CREATE OR REPLACE TEMP MACRO fold_error_shown(error_key, final_key) AS
    coalesce(error_key >= 36028797018963968 OR final_key // 72057594037927936 = 7, true);

-- quantile_cont from the order statistics `vals` (rank -> value) of n values, in its
-- arithmetic: rn = (double) (n - 1) * q, d = rn - floor(rn): lo * (1 - d) + hi * d.
CREATE OR REPLACE TEMP MACRO fold_rn(n, q) AS CAST(n - 1 AS DOUBLE) * CAST(q AS DOUBLE);
CREATE OR REPLACE TEMP MACRO fold_quantile(vals, n, q) AS
    CASE WHEN fold_rn(n, q) = floor(fold_rn(n, q))
         THEN vals[CAST(floor(fold_rn(n, q)) AS BIGINT)]
         ELSE vals[CAST(floor(fold_rn(n, q)) AS BIGINT)]
                  * (1 - (fold_rn(n, q) - floor(fold_rn(n, q))))
              + vals[CAST(ceil(fold_rn(n, q)) AS BIGINT)]
                  * (fold_rn(n, q) - floor(fold_rn(n, q)))
    END;

-- Summary counts per (dimension, value, bin) of rows with a sign: +1 a row that comes,
-- -1 one that a merge replaces, so the table is kept by adding deltas. Rows the tasks
-- view leaves out (no state, no name) count nowhere; a nameless attempt counts under its
-- actor's repr, as the view names it when no other attempt has a name (the view's
-- name from another attempt is not seen here: such an attempt counts under that repr,
-- or no name, until it has one of its own).
-- Ray's driver task counts only under `driver` (by job), as Ray's own summary leaves it
-- out; a failure counts under its exception class where Ray parsed one (summaries.sql).
CREATE OR REPLACE TEMP MACRO fold_is_driver(task_type) AS coalesce(task_type, '') = 'DRIVER_TASK';
-- The rows are first counted per combination of every dimension, state and bin (an
-- hour of a busy cluster has far fewer combinations than attempts): the dimensions are
-- then taken from those counts, not from each attempt six times.
CREATE OR REPLACE TEMP MACRO fold_bins_of(rows) AS TABLE
WITH t AS (
    SELECT sign, coalesce(final_state, 'UNKNOWN') AS state, coalesce(name, actor_repr) AS name,
           CASE WHEN fold_error_shown(error_key, final_key)
                THEN coalesce(error.exception_class, error.error_type) END AS error,
           job_key(job_id, session) AS job, node_id, duration_s IS NOT NULL AS timed, bin,
           fold_is_driver(task_type) AS driver
    FROM query_table(rows)
    WHERE has_state OR name IS NOT NULL
),
combinations AS (
    SELECT state, name, error, job, node_id, timed, bin, driver, sum(sign) AS sign
    FROM t GROUP BY ALL
),
counted AS (SELECT * FROM combinations WHERE NOT driver),
d AS (
    SELECT sign, 'all' AS dimension, CAST(NULL AS VARCHAR) AS value, state, timed, bin
    FROM counted
    UNION ALL SELECT sign, 'state', state, state, timed, bin FROM counted
    UNION ALL SELECT sign, 'name', name, state, timed, bin FROM counted
    UNION ALL SELECT sign, 'error_type', error, state, timed, bin FROM counted
        WHERE error IS NOT NULL OR state = 'FAILED'
    UNION ALL SELECT sign, 'job', job, state, timed, bin FROM counted
    UNION ALL SELECT sign, 'node', node_id, state, timed, bin FROM counted
    UNION ALL SELECT sign, 'driver', job, state, timed, bin FROM combinations WHERE driver
)
SELECT dimension, value, bin,
    CAST(sum(sign) AS BIGINT) AS tasks,
    CAST(coalesce(sum(sign) FILTER (WHERE state = 'FINISHED'), 0) AS BIGINT) AS finished,
    CAST(coalesce(sum(sign) FILTER (WHERE state = 'FAILED'), 0) AS BIGINT) AS failed,
    CAST(coalesce(sum(sign) FILTER (WHERE timed), 0) AS BIGINT) AS durations
FROM d
GROUP BY ALL;

-- @ids
-- Every (event_id, kind) of the batch once, by its 64-bit hash, with its number of copies
-- in the batch and whether an earlier batch counted it. Copies of an event repeat the
-- producer's fields, so any copy's time will do.
CREATE OR REPLACE TEMP TABLE fold_ids AS
SELECT hash(event_id, kind) AS h, kind, min(epoch_us(time)) AS us,
       coalesce(min(epoch_us(time)), -9223372036854775808) AS t, count(*) AS copies,
       false AS counted
FROM fold_rows GROUP BY 1, 2;

-- @counted
-- (Skipped while `seen` is empty: on a first build, checking 10 million ids against
-- nothing cost over a second.)
-- `seen` is kept in time order (t: the event's time, microseconds; NULL time first), and
-- a copy has its event's time, so the semi join matches on (t, h): DuckDB pushes the
-- batch's min and max t into the scan of `seen`, whose zone maps skip every row group
-- outside the batch's time span (a file of the last minutes reads a few row groups,
-- not 10 million hashes). The semi join hashes the batch's ids and streams `seen` past.
UPDATE fold_ids SET counted = true
WHERE h IN (SELECT s.h FROM fold.seen AS s SEMI JOIN fold_ids AS i ON s.t = i.t AND s.h = i.h);

-- @batch
INSERT INTO fold.seen SELECT t, h FROM fold_ids WHERE NOT counted ORDER BY t;
-- The batch's new counts per (second, kind) joined to the kept row (unique per second
-- and kind), whose rowid is kept so the old row goes by rowid.
CREATE OR REPLACE TEMP TABLE fold_timeline AS
SELECT n.second, n.kind, n.events + coalesce(t.events, 0) AS events,
       least(n.first_us, t.first_us) AS first_us, greatest(n.last_us, t.last_us) AS last_us,
       t.rowid AS r
FROM (
    SELECT us // 1000000 AS second, kind, count(*) AS events, min(us) AS first_us,
           max(us) AS last_us
    FROM fold_ids WHERE NOT counted GROUP BY ALL
) AS n
LEFT JOIN fold.timeline AS t
    ON t.second IS NOT DISTINCT FROM n.second AND t.kind IS NOT DISTINCT FROM n.kind;
DELETE FROM fold.timeline WHERE rowid IN (SELECT r FROM fold_timeline WHERE r IS NOT NULL);
INSERT INTO fold.timeline SELECT second, kind, events, first_us, last_us FROM fold_timeline;
-- A task's new events: its rows with an event_id, less the rows that are copies or were
-- counted before (few: a resent batch, a refolded file), plus their new distinct ids.
CREATE OR REPLACE TEMP TABLE fold_recount AS
SELECT coalesce(nullif(task_id, ''), event_id) AS task_id, coalesce(attempt, 0) AS attempt,
       coalesce(attrs['ray_session'], '') AS session,
       count(*) - count(DISTINCT r.h) FILTER (WHERE NOT s.counted) AS surplus
FROM (SELECT *, hash(event_id, kind) AS h FROM fold_rows
      WHERE kind = 'task' AND event_id IS NOT NULL) AS r
JOIN (SELECT h, counted FROM fold_ids WHERE copies > 1 OR counted) AS s ON r.h = s.h
GROUP BY ALL;
CREATE OR REPLACE TEMP VIEW fold_batch_partial AS
SELECT p.* REPLACE (p.events - coalesce(c.surplus, 0) AS events)
FROM fold_partial_of('fold_rows') AS p
LEFT JOIN fold_recount AS c USING (task_id, attempt, session);

-- @kinds_timeline
-- Compacted files whose task fragments the agent wrote at its hour merge
-- (sinks/fragments/): their tasks are the fragments merged (`fold_fragment_parts`, a
-- view fold.py makes), not a fold of their rows, and their timeline counts come from
-- the files' kind and time alone (`fold_kinds`). A compacted file holds one row per
-- event_id, so no hash of each id goes into `seen` for it: that is most of a first
-- open's time. (An event copied into two node-hours, a producer's resend across an hour
-- boundary, counts in both: docs/queries.md.) On S3 a batch counts them here; on a
-- local lake the copy does (@placed_kinds), as it copies their fragments' rows: no
-- `evagg query` command but `sql` reads the timeline, and counting 10 million events per second and kind
-- cost 0.40-0.44 CPU s of a first open.
CREATE OR REPLACE TEMP TABLE fold_timeline AS
SELECT n.second, n.kind, n.events + coalesce(t.events, 0) AS events,
       least(n.first_us, t.first_us) AS first_us, greatest(n.last_us, t.last_us) AS last_us,
       t.rowid AS r
FROM fold_timeline_of('fold_kinds') AS n
LEFT JOIN fold.timeline AS t
    ON t.second IS NOT DISTINCT FROM n.second AND t.kind IS NOT DISTINCT FROM n.kind;
DELETE FROM fold.timeline WHERE rowid IN (SELECT r FROM fold_timeline WHERE r IS NOT NULL);
INSERT INTO fold.timeline SELECT second, kind, events, first_us, last_us FROM fold_timeline;

-- @fragments_copied
-- (S3.) A Ray attempt's owner and executor halves are in two nodes' fragments: merged
-- here (only the attempts in more than one fragment are grouped), and every attempt is
-- copied into task_fold.
CREATE OR REPLACE TEMP VIEW fold_batch_partial AS
SELECT * FROM fold_merge_split_of('fold_fragment_parts');

-- @fragments_placed
-- (A local lake.) The fragments stay where they are: only the attempts that must be
-- merged go into task_fold, those found in two of the batch's fragments (a Ray
-- attempt's owner and executor halves, on two nodes), and, when task_fold or earlier
-- fragments hold rows (@fragments_placed_hits), those found there too. The rest stay in
-- place, counted in the summary bins here, once: every row of the batch counted (+1),
-- less each row of the attempts merged (-1, cancelling its own +1), which the merge
-- counts. Where no attempt is merged (most batches) there are no -1 rows, and the bins
-- read no key: an ANTI JOIN of every row against the merged keys cost 0.1-0.3 CPU s of
-- the first open at 10 million events.
-- Keys are compared by k (2.7 million rows grouped by k in 0.27-0.34 s, by the key 0.40-0.48):
-- a colliding k only sends an attempt through the merge, which regroups by the key.
CREATE OR REPLACE TEMP VIEW fold_keyed_parts AS
SELECT *, hash(task_id, attempt, session) AS k FROM fold_fragment_parts;
CREATE OR REPLACE TEMP TABLE fold_twice AS
SELECT k FROM fold_keyed_parts GROUP BY k HAVING count(*) > 1;

-- @fragments_placed_hits
INSERT INTO fold_twice
SELECT DISTINCT n.k FROM fold_keyed_parts AS n
SEMI JOIN (SELECT k FROM fold.task_fold UNION ALL SELECT k FROM fold_placed) AS o USING (k)
ANTI JOIN fold_twice AS t USING (k);

-- @fragments_placed_split
CREATE OR REPLACE TEMP VIEW fold_twice_parts AS
SELECT p.* EXCLUDE (k) FROM fold_keyed_parts AS p SEMI JOIN fold_twice USING (k);
CREATE OR REPLACE TEMP VIEW fold_batch_partial AS SELECT * FROM fold_merge_of('fold_twice_parts');
CREATE OR REPLACE TEMP VIEW fold_signed_placed AS
SELECT 1 AS sign, * FROM fold_finish_of('fold_fragment_parts')
UNION ALL BY NAME SELECT -1 AS sign, * FROM fold_finish_of('fold_twice_parts');

-- @fragment_hosts
-- ends.sql's session hosts from the fragments (the rows fold.py reads for facts are the
-- job, worker, node and agent events alone).
INSERT INTO fold.ends_session_hosts BY NAME
SELECT n.* FROM (
    SELECT DISTINCT session, host FROM fold_fragment_parts WHERE coalesce(host, '') <> ''
) AS n
ANTI JOIN fold.ends_session_hosts AS k USING (session, host);

-- @facts
-- The batch's facts of ends.sql merged into the kept ones: the keys the batch names are
-- taken out and put back merged (a batch names few: jobs, workers, nodes, agents).
CREATE OR REPLACE TEMP TABLE fold_fact_rows AS
SELECT * FROM fold_rows WHERE kind IN ('job', 'worker', 'node', 'agent');
CREATE OR REPLACE TEMP TABLE fold_new_facts AS SELECT * FROM ends_facts_of('fold_fact_rows');
CREATE OR REPLACE TEMP VIEW fold_facts_parts AS
SELECT f.* FROM fold.ends_facts AS f SEMI JOIN fold_new_facts AS n USING (session, kind, id)
UNION ALL BY NAME SELECT * FROM fold_new_facts;
CREATE OR REPLACE TEMP TABLE fold_facts_merged AS
SELECT * FROM ends_facts_merge_of('fold_facts_parts');
DELETE FROM fold.ends_facts AS f USING fold_new_facts AS n
WHERE f.session = n.session AND f.kind = n.kind AND f.id = n.id;
INSERT INTO fold.ends_facts BY NAME SELECT * FROM fold_facts_merged;
CREATE OR REPLACE TEMP TABLE fold_new_agents AS SELECT * FROM ends_agents_of('fold_fact_rows');
CREATE OR REPLACE TEMP VIEW fold_agents_parts AS
SELECT a.* FROM fold.ends_agents AS a SEMI JOIN fold_new_agents AS n USING (host)
UNION ALL BY NAME SELECT * FROM fold_new_agents;
CREATE OR REPLACE TEMP TABLE fold_agents_merged AS
SELECT * FROM ends_agents_merge_of('fold_agents_parts');
DELETE FROM fold.ends_agents AS a USING fold_new_agents AS n WHERE a.host = n.host;
INSERT INTO fold.ends_agents BY NAME SELECT * FROM fold_agents_merged;
INSERT INTO fold.ends_session_hosts BY NAME
SELECT n.* FROM ends_session_hosts_of('fold_rows') AS n
ANTI JOIN fold.ends_session_hosts AS k USING (session, host);

-- @merge_batch
CREATE OR REPLACE TEMP TABLE fold_batch AS SELECT * FROM fold_finish_of('fold_batch_partial');

-- @placed_kinds
-- (Before @kinds_timeline and @persist, in their transaction.) The kind and time of the
-- compacted files whose fragments are read in place: their timeline, which the view
-- fold_timeline_all counted on every read until now, is counted into fold.timeline.
CREATE OR REPLACE TEMP VIEW fold_kinds AS SELECT * FROM fold_placed_kinds;

-- @persist
-- The rows read in place copied into task_fold, after a first open answered from them
-- (fold_place.py): the same rows, so the summary bins and the kept summary stand as
-- they are. Later queries then read the table, as cheap as before fragments were read in
-- place; reading them in place cost every later `evagg query summary` 0.2 s more at 10
-- million events, a tasks query 0.5-0.7 s.
INSERT INTO fold.task_fold BY NAME
SELECT p.* FROM fold_placed AS p ANTI JOIN fold.task_fold AS s USING (task_id, attempt, session);
DELETE FROM fold.placed;
DROP TABLE IF EXISTS fold_timeline;
DROP VIEW IF EXISTS fold_kinds;

-- @hit
-- The stored rows the batch touches, found reading k alone (on every thread: a scan of
-- every row), then fetched by rowid (@merge): the join pushes the rowids' min and max
-- into the scan, and the rows a new file touches are recent, so near the end (a merge
-- re-inserts what it rewrites at the end), so only the last row groups are read; none
-- at all when the batch's tasks are all new.
CREATE OR REPLACE TEMP TABLE fold_hit AS
SELECT f.rowid AS r FROM fold.task_fold AS f SEMI JOIN fold_batch AS b USING (k);
-- The rows read in place that the batch touches (none when no fragment is read in place).
CREATE OR REPLACE TEMP TABLE fold_hit_placed AS
SELECT p.* FROM fold_placed AS p SEMI JOIN fold_batch AS b USING (k);

-- @merge
CREATE OR REPLACE TEMP TABLE fold_old AS
SELECT f.* FROM fold.task_fold AS f SEMI JOIN fold_hit AS h ON f.rowid = h.r;
-- An in-place row whose key a stored row has is superseded by it (it is neither shown
-- nor counted), and that stored row is a hit too (same k): left out here. The merged
-- row goes into task_fold, which supersedes the in-place one from then on.
INSERT INTO fold_old BY NAME
SELECT p.* FROM fold_hit_placed AS p ANTI JOIN fold_old AS o USING (task_id, attempt, session);
-- Only the batch's rows of tasks already stored are merged: a merge of one partial row
-- is that row (each arg_max kept with its key), so the batch's new tasks pass as they are.
CREATE OR REPLACE TEMP VIEW fold_parts AS
SELECT * FROM fold_old UNION ALL BY NAME
SELECT b.* FROM fold_batch AS b SEMI JOIN fold_old AS o USING (task_id, attempt, session);
CREATE OR REPLACE TEMP VIEW fold_parts_merged AS SELECT * FROM fold_merge_of('fold_parts');
CREATE OR REPLACE TEMP TABLE fold_merged AS SELECT * FROM fold_finish_of('fold_parts_merged');
CREATE OR REPLACE TEMP VIEW fold_new AS
SELECT b.* FROM fold_batch AS b ANTI JOIN fold_old AS o USING (task_id, attempt, session);
CREATE OR REPLACE TEMP VIEW fold_signed AS
SELECT -1 AS sign, * FROM fold_old
UNION ALL BY NAME SELECT 1 AS sign, * FROM fold_merged
UNION ALL BY NAME SELECT 1 AS sign, * FROM fold_new;
DELETE FROM fold.task_fold WHERE rowid IN (SELECT r FROM fold_hit);
INSERT INTO fold.task_fold BY NAME
SELECT * FROM fold_merged UNION ALL BY NAME SELECT * FROM fold_new;

-- @fresh
-- No stored row is touched (a file of new tasks): the batch's rows go in as they are.
INSERT INTO fold.task_fold BY NAME SELECT * FROM fold_batch;
CREATE OR REPLACE TEMP VIEW fold_signed AS SELECT 1 AS sign, * FROM fold_batch;

-- @append
-- Into an empty table (a first build): the batch's rows go straight in, and the summary
-- counts come from the table, rather than through a temp table of 2.7 million rows.
INSERT INTO fold.task_fold BY NAME SELECT * FROM fold_finish_of('fold_batch_partial');
CREATE OR REPLACE TEMP VIEW fold_signed AS SELECT 1 AS sign, * FROM fold.task_fold;

-- @bins
-- The signed rows' counts added to the kept counts, in one pass: the change per bin
-- (unique per bin) joined to the bin's kept row (unique too), whose rowid is kept so the
-- old row goes by rowid; a bin that reaches 0 goes. fold_signed_placed: the rows a batch
-- of fragments leaves in place (@fragments_placed_split), else none.
CREATE OR REPLACE TEMP VIEW fold_signed_all AS
SELECT * FROM fold_signed UNION ALL BY NAME SELECT * FROM fold_signed_placed;
CREATE OR REPLACE TEMP TABLE fold_bins AS
SELECT d.dimension, d.value, d.bin, d.tasks + coalesce(b.tasks, 0) AS tasks,
       d.finished + coalesce(b.finished, 0) AS finished,
       d.failed + coalesce(b.failed, 0) AS failed,
       d.durations + coalesce(b.durations, 0) AS durations, b.rowid AS r
FROM fold_bins_of('fold_signed_all') AS d LEFT JOIN fold.summary_bins AS b
    ON b.dimension = d.dimension AND b.value IS NOT DISTINCT FROM d.value
    AND b.bin IS NOT DISTINCT FROM d.bin;
DELETE FROM fold.summary_bins WHERE rowid IN (SELECT r FROM fold_bins WHERE r IS NOT NULL);
INSERT INTO fold.summary_bins
SELECT dimension, value, bin, tasks, finished, failed, durations FROM fold_bins
WHERE tasks <> 0;

-- @cleanup
DROP VIEW IF EXISTS fold_signed_all;
CREATE OR REPLACE TEMP VIEW fold_signed_placed AS SELECT * FROM fold_empty_signed;
DROP VIEW IF EXISTS fold_twice_parts;
DROP VIEW IF EXISTS fold_keyed_parts;
DROP TABLE IF EXISTS fold_twice;
DROP TABLE IF EXISTS fold_hit_placed;
DROP VIEW IF EXISTS fold_kinds;
DROP VIEW IF EXISTS fold_fragment_parts;
DROP VIEW IF EXISTS fold_facts_parts;
DROP VIEW IF EXISTS fold_agents_parts;
DROP TABLE IF EXISTS fold_fact_rows;
DROP TABLE IF EXISTS fold_new_facts;
DROP TABLE IF EXISTS fold_facts_merged;
DROP TABLE IF EXISTS fold_new_agents;
DROP TABLE IF EXISTS fold_agents_merged;
DROP TABLE IF EXISTS fold_ids;
DROP TABLE IF EXISTS fold_recount;
DROP TABLE IF EXISTS fold_timeline;
DROP TABLE IF EXISTS fold_batch;
DROP VIEW IF EXISTS fold_signed;
DROP VIEW IF EXISTS fold_new;
DROP VIEW IF EXISTS fold_parts_merged;
DROP VIEW IF EXISTS fold_parts;
DROP VIEW IF EXISTS fold_batch_partial;
DROP TABLE IF EXISTS fold_merged;
DROP TABLE IF EXISTS fold_old;
DROP TABLE IF EXISTS fold_hit;
DROP TABLE IF EXISTS fold_bins;
DROP TABLE IF EXISTS fold_wanted;
DROP VIEW IF EXISTS fold_bins_now;
DROP TABLE IF EXISTS fold_renamed;
DROP TABLE IF EXISTS fold_nameless;
DROP TABLE IF EXISTS fold_ends_now;
DROP VIEW IF EXISTS fold_ended_signed;
DROP TABLE IF EXISTS fold_ended;

-- @views
-- task_attempts over the fold (fold_tasks: the stored rows and those read in place):
-- tasks.sql's final SELECT, reading the kept aggregates
-- (ends.sql's `tasks` adds the ends evagg infers). The other attempts' names are looked
-- up only for tasks with a nameless attempt (a window over every row, as tasks.sql has,
-- would stop filters reaching the scan of task_fold).
CREATE OR REPLACE VIEW task_attempts AS
WITH nameless AS (
    SELECT DISTINCT task_id, session FROM fold_tasks WHERE name IS NULL
),
siblings AS (
    SELECT task_id, session, max(name) AS name, max(function) AS function
    FROM fold_tasks SEMI JOIN nameless USING (task_id, session)
    GROUP BY ALL
)
SELECT
    task_id,
    attempt,
    coalesce(f.name, o.name, o.function, actor_repr) AS name,
    coalesce(final_state, 'UNKNOWN') AS final_state,
    pending_at,
    submitted_at,
    running_at,
    CASE WHEN final_state = 'FINISHED' THEN coalesce(finished_at, inferred_at)
         ELSE finished_at END AS finished_at,
    CASE WHEN final_state = 'FAILED' THEN coalesce(failed_at, inferred_at)
         ELSE failed_at END AS failed_at,
    duration_s,
    job_id,
    node_id,
    worker_id,
    coalesce(pid_attr, pid_running, pid_any) AS pid,
    actor_id,
    parent_id,
    trace_id,
    CASE WHEN shown THEN error.error_type END AS error_type,
    CASE WHEN shown THEN error.exception_class END AS exception_class,
    CASE WHEN shown THEN error.error_message END AS error_message,
    CASE WHEN shown THEN error.stack_trace END AS stack_trace,
    source,
    task_type,
    f.function AS function,
    nullif(session, '') AS ray_session,
    first_seen,
    last_seen,
    events,
    CASE WHEN final_key // 72057594037927936 = 7 THEN f.inferred END AS inferred,
    host,
    session
FROM (SELECT *, coalesce(error_key >= 36028797018963968
                          OR final_key // 72057594037927936 = 7, true) AS shown
      FROM fold_tasks) AS f
LEFT JOIN siblings AS o USING (task_id, session)
WHERE has_state OR f.name IS NOT NULL;

-- ends.sql's facts, from the fold's tables.
CREATE OR REPLACE VIEW ends_facts AS SELECT * FROM fold.ends_facts;
CREATE OR REPLACE VIEW ends_agents AS SELECT * FROM fold.ends_agents;
CREATE OR REPLACE VIEW ends_session_hosts AS SELECT * FROM fold.ends_session_hosts;

-- @counts
-- (After ends.sql's overlay, which these read.)
-- Tasks by final state, from the summary counts (a few rows, not every task), with the
-- attempts ends.sql ends moved from the state they were counted in to FAILED.
CREATE OR REPLACE VIEW task_state_counts AS
SELECT state, CAST(sum(tasks) AS BIGINT) AS tasks
FROM (
    SELECT value AS state, tasks FROM fold.summary_bins WHERE dimension = 'state'
    UNION ALL
    SELECT unnest([a.final_state, e.final_state]), unnest([-1, 1])
    FROM task_ends AS e JOIN task_attempts AS a
        ON e.task_id = a.task_id AND e.attempt = a.attempt AND e.session = a.session
    WHERE coalesce(a.task_type, '') <> 'DRIVER_TASK'  -- counted under `driver` only
)
GROUP BY state
HAVING sum(tasks) <> 0;

-- Events over time by kind, per second (distinct events, as the `events` view counts):
-- the kept counts, and those of compacted files read in place (fold_place.py).
CREATE OR REPLACE VIEW event_timeline AS
SELECT second, kind, events, first_us, last_us FROM fold_timeline_all;

-- @summary
-- task_summary (summaries.sql) from summary_bins: counts add up; each quantile is
-- quantile_cont's, the order statistics at floor and ceil of (n - 1) q interpolated,
-- read from the only bin that holds each one (a few thousand task rows, not all).
-- Two statements: the bins holding the wanted ranks first (a temp table), then the task
-- rows of those bins, with the bins written into the SQL as integers (fold.py puts them
-- in place of @bins): a constant IN list is checked in the scan of task_fold, where a
-- join against the CTE, or a list parameter, let half the table's rows through (every
-- projected column of 1.3 million rows, to keep 50,000).
-- The tasks view names a nameless attempt after another attempt of its task, which the
-- bins (counted row by row) cannot see: fold_renamed holds those attempts (few: an
-- actor's restarted creation task without its definition) and fold_bins_now moves
-- them from the name they were counted under to the one the view shows.
-- (An attempt ends.sql ends moves with the state the tasks view shows, its end's.)
-- fold_ends_now is task_ends once (fold.py made it for the summary's key): as a table of
-- known size, a join with it reads the fold's rows only where it has any, where the view
-- let DuckDB scan every row first (1.2 s of 2.4 with half a million rows read in place).
-- The nameless attempts are a table first for the same reason: none, no scan for
-- their siblings.
CREATE OR REPLACE TEMP TABLE fold_nameless AS
    SELECT task_id, attempt, session, actor_repr,
           coalesce(e.final_state, f.final_state) AS final_state,
           CASE WHEN e.end_at IS NULL THEN f.duration_s
                ELSE (epoch_us(e.end_at) - epoch_us(f.running_at)) / 1e6 END AS duration_s,
           CASE WHEN e.end_at IS NULL THEN f.bin
                ELSE fold_bin((epoch_us(e.end_at) - epoch_us(f.running_at)) / 1e6) END AS bin
    FROM fold_tasks AS f
    LEFT JOIN fold_ends_now AS e USING (task_id, attempt, session)
    WHERE f.name IS NULL AND f.has_state AND NOT fold_is_driver(f.task_type);
CREATE OR REPLACE TEMP TABLE fold_renamed AS
WITH siblings AS (
    SELECT task_id, session, coalesce(max(name), max(function)) AS sibling_name
    FROM fold_tasks SEMI JOIN fold_nameless USING (task_id, session)
    GROUP BY ALL
)
SELECT n.*, o.sibling_name
FROM fold_nameless AS n JOIN siblings AS o USING (task_id, session)
WHERE o.sibling_name IS NOT NULL;
-- The attempts ends.sql ends, as counted (-1) and as the tasks view shows them (+1).
CREATE OR REPLACE TEMP TABLE fold_ended AS
SELECT f.*, e.end_at, e.final_state AS end_state, e.error_type AS end_error_type,
       e.error_message AS end_error_message,
       (epoch_us(e.end_at) - epoch_us(f.running_at)) / 1e6 AS end_duration_s
FROM fold_tasks AS f JOIN fold_ends_now AS e
    ON e.task_id = f.task_id AND e.attempt = f.attempt AND e.session = f.session;
CREATE OR REPLACE TEMP VIEW fold_ended_signed AS
SELECT -1 AS sign,
       * EXCLUDE (end_at, end_state, end_error_type, end_error_message, end_duration_s)
FROM fold_ended
UNION ALL BY NAME
SELECT 1 AS sign,
       * EXCLUDE (end_at, end_state, end_error_type, end_error_message, end_duration_s)
    REPLACE (end_state AS final_state,
             {'error_type': end_error_type, 'exception_class': error.exception_class,
              'error_message': end_error_message, 'stack_trace': error.stack_trace} AS error,
             end_duration_s AS duration_s, fold_bin(end_duration_s) AS bin)
FROM fold_ended;
CREATE OR REPLACE TEMP VIEW fold_bins_now AS
WITH moves AS (
    SELECT -1 AS sign, actor_repr AS value, * EXCLUDE (actor_repr, sibling_name)
    FROM fold_renamed
    UNION ALL
    SELECT 1, sibling_name, * EXCLUDE (actor_repr, sibling_name) FROM fold_renamed
)
SELECT dimension, value, bin, CAST(sum(tasks) AS BIGINT) AS tasks,
       CAST(sum(finished) AS BIGINT) AS finished, CAST(sum(failed) AS BIGINT) AS failed,
       CAST(sum(durations) AS BIGINT) AS durations
FROM (
    SELECT dimension, value, bin, tasks, finished, failed, durations FROM fold.summary_bins
    UNION ALL
    SELECT 'name', value, bin, sign, sign * CAST(final_state = 'FINISHED' AS BIGINT),
           sign * CAST(final_state = 'FAILED' AS BIGINT),
           sign * CAST(duration_s IS NOT NULL AS BIGINT)
    FROM moves
    UNION ALL
    SELECT dimension, value, bin, tasks, finished, failed, durations
    FROM fold_bins_of('fold_ended_signed')
)
GROUP BY ALL
HAVING sum(tasks) <> 0;
CREATE OR REPLACE TEMP TABLE fold_wanted AS
WITH bins AS (SELECT * FROM fold_bins_now),
groups AS (
    SELECT dimension, value, sum(tasks) AS tasks, sum(finished) AS finished,
           sum(failed) AS failed, sum(durations) AS n
    FROM bins GROUP BY ALL
),
wanted_ranks AS (
    SELECT dimension, value, n, CAST(unnest([
        floor(fold_rn(n, 0.5)), ceil(fold_rn(n, 0.5)), floor(fold_rn(n, 0.9)),
        ceil(fold_rn(n, 0.9)), floor(fold_rn(n, 0.99)), ceil(fold_rn(n, 0.99)), n - 1])
        AS BIGINT) AS r
    FROM groups WHERE n > 0
),
-- Which bin holds each wanted rank, in two steps: running counts over coarse bins (32
-- bins each; `//` truncates, so -31..31 share one, still contiguous and in order) find
-- the coarse bin, then running counts over its few fine bins. One running sum over every
-- (dimension, value, bin) row cost more than the rest of the summary together.
counted AS (SELECT * FROM bins WHERE durations > 0 AND bin IS NOT NULL),
coarse AS (
    SELECT dimension, value, bin // 32 AS cb, sum(durations) AS durations
    FROM counted GROUP BY ALL
),
coarse_starts AS (
    SELECT *, sum(durations) OVER (PARTITION BY dimension, value ORDER BY cb) - durations
        AS before
    FROM coarse
),
coarse_wanted AS (
    SELECT DISTINCT w.dimension, w.value, w.r, c.cb, c.before AS coarse_before
    FROM wanted_ranks AS w JOIN coarse_starts AS c
        ON w.dimension = c.dimension AND w.value IS NOT DISTINCT FROM c.value
        AND w.r >= c.before AND w.r < c.before + c.durations
),
starts AS (
    SELECT w.dimension, w.value, w.r, b.bin, b.durations,
           w.coarse_before + sum(b.durations) OVER (
               PARTITION BY w.dimension, w.value, w.r ORDER BY b.bin) - b.durations AS before
    FROM coarse_wanted AS w JOIN counted AS b
        ON w.dimension = b.dimension AND w.value IS NOT DISTINCT FROM b.value
        AND b.bin // 32 = w.cb
),
wanted AS (
    SELECT DISTINCT dimension, value, r, bin, r - before AS k
    FROM starts WHERE r >= before AND r < before + durations
)
SELECT * FROM wanted;

-- @summary_done
DROP TABLE IF EXISTS fold_wanted;
DROP VIEW IF EXISTS fold_bins_now;
DROP TABLE IF EXISTS fold_renamed;
DROP TABLE IF EXISTS fold_nameless;
DROP VIEW IF EXISTS fold_ended_signed;
DROP TABLE IF EXISTS fold_ended;

-- @summary_table
CREATE OR REPLACE TABLE fold.summary AS
WITH groups AS (
    SELECT dimension, value, sum(tasks) AS tasks, sum(finished) AS finished,
           sum(failed) AS failed, sum(durations) AS n
    FROM fold_bins_now GROUP BY ALL
),
wanted AS (SELECT * FROM fold_wanted),
near AS (
    SELECT coalesce(f.final_state, 'UNKNOWN') AS state,
           coalesce(f.name, r.sibling_name, f.actor_repr) AS name,
           CASE WHEN fold_error_shown(f.error_key, f.final_key)
                THEN coalesce(f.error.exception_class, f.error.error_type) END AS error,
           job_key(f.job_id, f.session) AS job, f.node_id, f.duration_s, f.bin,
           fold_is_driver(f.task_type) AS driver
    FROM fold_tasks AS f LEFT JOIN fold_renamed AS r USING (task_id, attempt, session)
    ANTI JOIN fold_ended AS x
        ON x.task_id = f.task_id AND x.attempt = f.attempt AND x.session = f.session
    WHERE f.bin IN (@bins) AND (f.has_state OR f.name IS NOT NULL)
    UNION ALL
    SELECT f.end_state, coalesce(f.name, r.sibling_name, f.actor_repr),
           coalesce(CASE WHEN fold_error_shown(f.error_key, f.final_key)
                         THEN f.error.exception_class END, f.end_error_type),
           job_key(f.job_id, f.session), f.node_id, f.end_duration_s, fold_bin(f.end_duration_s),
           fold_is_driver(f.task_type)
    FROM fold_ended AS f LEFT JOIN fold_renamed AS r USING (task_id, attempt, session)
    WHERE fold_bin(f.end_duration_s) IN (@bins)
),
counted AS (SELECT * FROM near WHERE NOT driver),
near_dims AS (
    SELECT 'all' AS dimension, CAST(NULL AS VARCHAR) AS value, duration_s, bin FROM counted
    UNION ALL SELECT 'state', state, duration_s, bin FROM counted
    UNION ALL SELECT 'name', name, duration_s, bin FROM counted
    UNION ALL SELECT 'error_type', error, duration_s, bin FROM counted
        WHERE error IS NOT NULL OR state = 'FAILED'
    UNION ALL SELECT 'job', job, duration_s, bin FROM counted
    UNION ALL SELECT 'node', node_id, duration_s, bin FROM counted
    UNION ALL SELECT 'driver', job, duration_s, bin FROM near WHERE driver
),
ordered AS (
    SELECT dimension, value, bin, duration_s,
           row_number() OVER (PARTITION BY dimension, value, bin ORDER BY duration_s) - 1 AS k
    FROM near_dims AS d
    SEMI JOIN (SELECT DISTINCT dimension, value, bin FROM wanted) AS w
        ON d.dimension = w.dimension AND d.value IS NOT DISTINCT FROM w.value AND d.bin = w.bin
),
picked AS (
    SELECT w.dimension, w.value, w.r, o.duration_s
    FROM wanted AS w JOIN ordered AS o
        ON w.dimension = o.dimension AND w.value IS NOT DISTINCT FROM o.value
        AND w.bin = o.bin AND w.k = o.k
),
stats AS (
    SELECT g.dimension, g.value, g.n,
           map_from_entries(list({'k': p.r, 'v': p.duration_s})) AS vals
    FROM groups AS g JOIN picked AS p
        ON g.dimension = p.dimension AND g.value IS NOT DISTINCT FROM p.value
    GROUP BY ALL
)
SELECT
    g.dimension, g.value, CAST(g.tasks AS BIGINT) AS tasks,
    CAST(g.finished AS BIGINT) AS finished, CAST(g.failed AS BIGINT) AS failed,
    CAST(g.tasks - g.finished - g.failed AS BIGINT) AS unfinished,
    fold_quantile(s.vals, s.n, 0.5) AS p50_s,
    fold_quantile(s.vals, s.n, 0.9) AS p90_s,
    fold_quantile(s.vals, s.n, 0.99) AS p99_s,
    s.vals[CAST(s.n - 1 AS BIGINT)] AS max_s
FROM groups AS g LEFT JOIN stats AS s
    ON g.dimension = s.dimension AND g.value IS NOT DISTINCT FROM s.value
WHERE g.tasks > 0;
