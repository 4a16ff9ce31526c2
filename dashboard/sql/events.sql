-- events_raw: every stored row, duplicates included. {{source}} is filled in by
-- dashboard/lake/store.py: read_parquet over the current file list (hive columns date, hour,
-- node added), or a pyarrow dataset registered in DuckDB. Aggregates that ignore
-- duplicates (min, max, arg_max, bool_or, count(DISTINCT ...)) should read this view:
-- deduplication is the most expensive step of most queries.
-- `time` and `received` are Parquet TIMESTAMP(MICROS, UTC) in the files evagg writes;
-- older lakes' files hold TIMESTAMP(NANOS, UTC), which DuckDB 1.x reads as TIMESTAMPTZ
-- (microseconds, cut down) and DuckDB 2 as TIMESTAMPTZ_NS, which epoch_us and most
-- timestamp functions do not take. Every view works in microseconds, so
-- dashboard/lake/views.py fills {{time_us}} and {{received_us}} with each column cut down
-- to microseconds as 1.x does (nothing to do on 1.x): a lake of both reads the same.
CREATE OR REPLACE VIEW events_raw AS
SELECT * REPLACE ({{time_us}} AS time, {{received_us}} AS received)
FROM {{source}};

-- events: one row per event_id (the earliest received copy). A duplicate (a resent
-- batch, a file both before and after compaction) repeats the producer's fields, so
-- kind joins event_id in the PARTITION BY: a filter on kind is pushed below the window
-- into the Parquet scan, and a view over one kind deduplicates only that kind. (More
-- identity columns in the key would push more filters down, but cost 3-5x on every
-- full scan; to look up one task or trace, filter events_raw first, then deduplicate.)
CREATE OR REPLACE VIEW events AS
SELECT * FROM events_raw
QUALIFY row_number() OVER (PARTITION BY event_id, kind ORDER BY received NULLS LAST) = 1;
