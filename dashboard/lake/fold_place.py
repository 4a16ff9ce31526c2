"""The task fragments the fold reads where they are (a local lake) until it copies them.

Copying a day's fragments into the cache table was most of a first open (4 of 6 s for
10 million events: materializing 2.7 million rows), where reading them in place costs a
scan. So on a local lake a first open leaves a fragment's attempts in its file, named in
`fold.placed`; `fold.task_fold` keeps only the attempts that had to be merged
(dashboard/sql/fold.sql, @fragments_placed), and every reader of the fold reads the view
`fold_tasks`: the stored rows, and the in-place rows whose key no stored row has (a
stored row is their merge with whatever else touched the attempt, so it supersedes
them). Read in place on every query, though, they made later queries 1.4-1.7x slower:
once the first answer is out the fold copies them into the table (`TaskFold.persist`,
@persist; the store decides when) and the views read the table alone again.

The compacted files of those fragments are read in place too, for their events per
second and kind (the overview's timeline, `fold_timeline_all`): no `evagg query` command
but `sql` reads the timeline, so a first open does not count it (0.40-0.44 CPU s of a
first open at 10 million events); the copy does, as it copies the fragments' rows, and
until then every read of the timeline counts them (the dashboard's overview, once per
answer).

DuckDB's read_parquet takes its file list when a view is bound, so the views here name
the fragments and are made again whenever `fold.placed` changes (`bind`). Each view is
right by itself between a change of `fold.placed` and that bind: `fold_tasks` leaves out
the in-place rows the table holds, `fold_placed_kinds` the files `fold.placed` no longer
names. A fragment read in place, or its compacted file, that vanished or changed size
takes its attempts or its timeline with it: the fold is rebuilt (`changed`), as when a
folded file is lost unexplained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import duckdb

from dashboard.lake.fold_sql import insert
from dashboard.lake.listing import FileEntry, Listing
from dashboard.lake.s3 import sql_literal
from dashboard.lake.views import micros

# SQL reading fragment files (by the paths DuckDB opens) as they are written.
PlacedSource = Callable[[Sequence[str]], str]


def placed(cur: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The fragments read in place: path -> size when they were placed."""
    return {str(p): int(s) for p, s in
            cur.execute("SELECT fragment, size FROM fold.placed").fetchall()}


def changed(cur: duckdb.DuckDBPyConnection, listing: Listing) -> list[str]:
    """The fragments read in place, and their compacted files (read in place for their
    timeline), that are no longer listed at their size."""
    listed = {f.path: f.size for f in listing.fragments}
    lost = [p for p, size in placed(cur).items() if listed.get(p) != size]
    files = {f.path: f.size for f in listing.files}
    return lost + [p for p, size in cur.execute(
        "SELECT DISTINCT p.path, f.size FROM fold.placed AS p "
        "LEFT JOIN fold.files AS f USING (path)").fetchall() if files.get(p) != size]


def place(cur: duckdb.DuckDBPyConnection, files: Sequence[FileEntry],
          fragments: Sequence[FileEntry]) -> None:
    """Record `fragments`, those of the compacted `files`, as read in place (inside the
    batch's transaction)."""
    insert(cur, "fold.placed",
           [(f.path, f.size, c.path) for c, f in zip(files, fragments, strict=True)])


def bind(cur: duckdb.DuckDBPyConnection, source: PlacedSource | None) -> int:
    """(Re)make fold_placed and fold_tasks over the fragments `fold.placed` names; returns
    how many. Views of the connection's own database, not temporary: every cursor reads
    them."""
    paths = sorted(placed(cur)) if source is not None else []
    if not paths:
        cur.execute("CREATE OR REPLACE VIEW fold_placed AS "
                    "SELECT * FROM fold.task_fold WHERE false;\n"
                    "CREATE OR REPLACE VIEW fold_tasks AS SELECT * FROM fold.task_fold;\n"
                    "CREATE OR REPLACE VIEW fold_placed_kinds AS SELECT CAST(NULL AS VARCHAR) "
                    "AS kind, CAST(NULL AS TIMESTAMPTZ) AS time WHERE false;\n"
                    "CREATE OR REPLACE VIEW fold_timeline_all AS SELECT * FROM fold.timeline;")
        return 0
    assert source is not None
    cur.execute(f"CREATE OR REPLACE VIEW fold_placed_parts AS SELECT * FROM {source(paths)};\n"
                "CREATE OR REPLACE VIEW fold_placed AS "
                "SELECT * FROM fold_finish_of('fold_placed_parts');\n"
                "CREATE OR REPLACE VIEW fold_tasks AS SELECT * FROM fold.task_fold "
                "UNION ALL BY NAME SELECT p.* FROM fold_placed AS p "
                "ANTI JOIN fold.task_fold AS s USING (task_id, attempt, session);")
    _bind_timeline(cur, sorted({p for p, in cur.execute(
        "SELECT path FROM fold.placed").fetchall()}))
    return len(paths)


def _bind_timeline(cur: duckdb.DuckDBPyConnection, files: list[str]) -> None:
    """fold_timeline_all: the kept timeline, and the events per second and kind of the
    compacted `files` (those of the fragments read in place), which no stored row counts
    yet. Only rows of a file `fold.placed` still names count: the copy that counts them
    into fold.timeline (@persist) empties it in the same commit."""
    listed = ", ".join(sql_literal(p) for p in files)
    cur.execute(f"CREATE OR REPLACE VIEW fold_placed_kinds AS SELECT kind, {micros('time')} "
                f"AS time FROM read_parquet([{listed}], hive_partitioning = false, "
                "union_by_name = true, filename = 'fold_file') "
                "WHERE fold_file IN (SELECT path FROM fold.placed);\n"
                "CREATE OR REPLACE VIEW fold_timeline_all AS "
                "SELECT second, kind, CAST(sum(events) AS BIGINT) AS events, "
                "min(first_us) AS first_us, max(last_us) AS last_us FROM ("
                "SELECT second, kind, events, first_us, last_us FROM fold.timeline "
                "UNION ALL SELECT * FROM fold_timeline_of('fold_placed_kinds')) "
                "GROUP BY second, kind;")
