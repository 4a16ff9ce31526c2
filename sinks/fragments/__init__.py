"""Task fragments: the task fold done where the data is written.

When a Parquet sink merges an hour it has moved past, it also writes that node-hour's
fragment (`build.py`): one row per task attempt with what this node's events of that
hour say of it, in the mergeable form of `task_fold.py`, so that the cluster's tasks are
one GROUP BY over the fragments of every node and hour. `ddl.py` prints the statements
that give other engines (Spark, Trino, Athena, DuckDB) the same `events` and `tasks`
(`ddl_lake.py`: where they point; `ddl_types.py`: their column types).
"""
