-- The keys the summaries group by where an id alone names more than one thing. The
-- views run this file first; the task fold (dashboard/lake/fold.py) runs it before its
-- own statements, so both count under the same key.
--
-- A job: Ray numbers jobs from 01000000 again in every cluster, so a lake that outlives
-- its clusters holds many a job 01000000. A Ray job is therefore its id at its session
-- (01000000@session_2026-12-06_10-00-00_000001_1: the session `evagg query jobs` lists);
-- any other job is its id alone. The task filter `job` takes either form.
CREATE OR REPLACE MACRO job_key(job_id, session) AS
    CASE WHEN coalesce(session, '') = '' THEN job_id ELSE job_id || '@' || session END;
