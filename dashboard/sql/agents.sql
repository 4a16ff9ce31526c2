-- Agent heartbeats (kind = 'agent'): the metrics map holds the agent's own counters,
-- keyed "name{labels}"; totals add up every label set of one counter. A labelled counter
-- appears only once something was counted, so an absent one is 0 (list_sum of no
-- entries is NULL). Counters are counts: they come out as integers, not as 2159.000.
CREATE OR REPLACE VIEW heartbeats AS
SELECT
    node_id,
    time,
    state,
    host,
    attrs['version'] AS version,
    CAST(round(coalesce(list_sum(list_transform(
        list_filter(map_entries(metrics), lambda e: starts_with(e.key, 'evagg_received_events_total')),
        lambda e: e.value)), 0)) AS BIGINT) AS received_total,
    CAST(round(coalesce(list_sum(list_transform(
        list_filter(map_entries(metrics), lambda e: starts_with(e.key, 'evagg_delivered_events_total')),
        lambda e: e.value)), 0)) AS BIGINT) AS delivered_total,
    CAST(round(coalesce(list_sum(list_transform(
        list_filter(map_entries(metrics), lambda e: starts_with(e.key, 'evagg_dropped_events_total')),
        lambda e: e.value)), 0)) AS BIGINT) AS dropped_total,
    CAST(round(metrics['evagg_spool_bytes']) AS BIGINT) AS spool_bytes,
    TRY_CAST(attrs['heartbeat_interval_s'] AS DOUBLE) AS interval_s,
    attrs['started_at'] AS started_at,
    metrics
FROM events
WHERE kind = 'agent';

-- losses: events lost by policy, as the agent (or an emitter) reported them. An
-- emitter's report carries its run and job, so a run's losses are one filter away.
CREATE OR REPLACE VIEW losses AS
SELECT
    time,
    node_id,
    name AS reason,
    source,
    CAST(round(coalesce(metrics['events'], 0)) AS BIGINT) AS events,
    run_id,
    job_id
FROM events
WHERE kind = 'loss';

-- agents: one row per node. Throughput is the received counter's rise between the last
-- two heartbeats, per second (NULL until there are two, or after an agent restart).
-- A restart is a heartbeat of another agent process than the one before (attrs
-- started_at), or, in heartbeats written before agents said so, the counters going down
-- (a new agent counts from 0, but one that received as much as its predecessor shows no
-- fall). A gap is the time between two heartbeats, counted as missed when over 1.5x the
-- interval the agent said it beats at (attrs heartbeat_interval_s; 30 s, the default,
-- where none is said); the time after an agent's final heartbeat (state STOPPING: it was
-- stopped, not lost) until the next agent starts is not a gap.
CREATE OR REPLACE VIEW agents AS
WITH beats AS (
    SELECT *,
           lag(received_total) OVER w AS prev_received,
           lag(delivered_total) OVER w AS prev_delivered,
           lag(time) OVER w AS prev_time,
           lag(state) OVER w AS prev_state,
           lag(started_at) OVER w AS prev_started_at,
           row_number() OVER (PARTITION BY node_id ORDER BY time DESC) AS newest,
           count(*) OVER (PARTITION BY node_id) AS heartbeats
    FROM heartbeats
    WINDOW w AS (PARTITION BY node_id ORDER BY time)
),
marked AS (
    SELECT *,
           prev_time IS NOT NULL AND (started_at IS DISTINCT FROM prev_started_at
                                      OR received_total < prev_received
                                      OR delivered_total < prev_delivered) AS restart,
           CASE WHEN coalesce(prev_state, '') <> 'STOPPING'
                THEN epoch_us(time) / 1e6 - epoch_us(prev_time) / 1e6 END AS gap_s
    FROM beats
),
ordered AS (
    SELECT *,
           count(*) FILTER (WHERE restart) OVER n AS restarts,
           -- when the new process started, as its heartbeats say (its first beat, written
           -- as it starts, comes a little later); the beat's time where one does not say
           max(coalesce(TRY_CAST(started_at AS TIMESTAMPTZ), time)) FILTER (WHERE restart)
               OVER n AS restarted_at,
           max(gap_s) OVER n AS longest_gap_s,
           count(*) FILTER (WHERE gap_s > 1.5 * coalesce(interval_s, 30)) OVER n AS missed_gaps
    FROM marked
    WINDOW n AS (PARTITION BY node_id)
),
lost AS (
    SELECT node_id, CAST(sum(events) AS BIGINT) AS lost_events, count(*) AS loss_reports,
           max(time) AS last_loss_at
    FROM losses GROUP BY node_id
)
SELECT
    o.node_id,
    o.time AS last_seen,
    o.state,
    o.host,
    o.version,
    o.heartbeats,
    o.received_total,
    o.delivered_total,
    o.dropped_total,
    o.spool_bytes,
    o.interval_s AS heartbeat_interval_s,
    o.restarts,
    o.restarted_at,
    o.longest_gap_s,
    o.missed_gaps,
    CASE WHEN NOT o.restart AND o.time > o.prev_time
         THEN (o.received_total - o.prev_received)
              / (epoch_us(o.time) / 1e6 - epoch_us(o.prev_time) / 1e6)
    END AS received_per_s,
    CASE WHEN NOT o.restart AND o.time > o.prev_time
         THEN (o.delivered_total - o.prev_delivered)
              / (epoch_us(o.time) / 1e6 - epoch_us(o.prev_time) / 1e6)
    END AS delivered_per_s,
    coalesce(l.lost_events, 0) AS lost_events,
    coalesce(l.loss_reports, 0) AS loss_reports,
    l.last_loss_at,
    -- silent: no heartbeat for longer than the agent said it may miss (ends.sql), so
    -- readers take its node for dead and end what was open there
    coalesce(v.silent, false) AS silent,
    v.silent_after_s
FROM ordered o
LEFT JOIN lost l ON l.node_id IS NOT DISTINCT FROM o.node_id
LEFT JOIN agent_liveness v ON v.host = o.host
WHERE o.newest = 1;
