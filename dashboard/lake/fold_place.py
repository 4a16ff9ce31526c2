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

DuckDB's read_parquet takes its file list when a view is bound, so the views here name
the fragments and are made again whenever `fold.placed` changes (`bind`). A fragment
read in place that vanished or changed size takes its attempts with it: the fold is
rebuilt (`changed`), as when a folded file is lost unexplained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import duckdb

from dashboard.lake.fold_sql import insert
from dashboard.lake.listing import FileEntry, Listing

# SQL reading fragment files (by the paths DuckDB opens) as they are written.
PlacedSource = Callable[[Sequence[str]], str]


def placed(cur: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The fragments read in place: path -> size when they were placed."""
    return {str(p): int(s) for p, s in
            cur.execute("SELECT fragment, size FROM fold.placed").fetchall()}


def changed(cur: duckdb.DuckDBPyConnection, listing: Listing) -> list[str]:
    """The fragments read in place that are no longer listed at their size."""
    listed = {f.path: f.size for f in listing.fragments}
    return [p for p, size in placed(cur).items() if listed.get(p) != size]


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
                    "CREATE OR REPLACE VIEW fold_tasks AS SELECT * FROM fold.task_fold;")
        return 0
    assert source is not None
    cur.execute(f"CREATE OR REPLACE VIEW fold_placed_parts AS SELECT * FROM {source(paths)};\n"
                "CREATE OR REPLACE VIEW fold_placed AS "
                "SELECT * FROM fold_finish_of('fold_placed_parts');\n"
                "CREATE OR REPLACE VIEW fold_tasks AS SELECT * FROM fold.task_fold "
                "UNION ALL BY NAME SELECT p.* FROM fold_placed AS p "
                "ANTI JOIN fold.task_fold AS s USING (task_id, attempt, session);")
    return len(paths)
