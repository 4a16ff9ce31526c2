"""The lake and its fold: one DuckDB connection over one evagg store, and how it is read.

`store.py` is the connection (listing, views, queries, the task fold's upkeep); how the
files are read is a source object from `sources/` (local files, S3 through DuckDB's
httpfs, or pyarrow), S3's settings are `s3.py`; `listing.py` lists the Parquet files,
`views.py` creates the views of `dashboard/sql/`, `fold.py` (with `fold_cache.py` and
`fold_files.py`) keeps the incremental task table, `results.py` is what a query returns,
`errors.py` the dashboard's own errors and `cancel.py` stops a running query. This room
imports no other room of the dashboard.
"""
