"""The folded task table, kept up to date file by file (dashboard/sql/fold.sql).

`TaskFold` attaches a DuckDB database as `fold` to the store's connection: a cache file
keyed by the data location (docs/queries.md, "The task fold"), or memory when there is
no cache directory, it cannot be written, or another process holds it. `sync(listing)`
folds only the Parquet files it has not folded yet (path and size), so a query after a
new file costs that file, not the whole store. Files that vanish are fine when a listed
compacted file says it covers them (`evagg compact` writes that in its metadata);
any other loss (retention deleted data, a file rewritten with another size) rebuilds.
On a local lake the task fragments are read where they are, not copied
(dashboard/lake/fold_place.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import duckdb

from dashboard.lake import fold_place
from dashboard.lake.fold_cache import attach_cache, cache_file, default_cache_dir
from dashboard.lake.fold_files import (
    Cover,
    batches,
    by_fragment,
    coverage,
    explained,
    held_by_folder,
    is_compacted,
    parent_and_name,
    parse_covers,
)
from dashboard.lake.fold_sql import (
    insert,
    project,
    read_sql,
    sql_sections,
    task_fold_macros,
    threads,
)
from dashboard.lake.listing import FileEntry, Listing
from dashboard.lake.views import micros
from sinks.fragments.task_fold import FOLD_COLUMNS

log = logging.getLogger("evagg.dashboard.fold")
FORMAT = "5"  # bump when the tables change shape
# A batch this small folds on one thread: on a few cores, splitting ~50,000 rows over
# threads cost more than it saved (each statement 2-3x slower on two threads).
SMALL_BATCH_BYTES = 64 * 2**20
# Folding this much takes a while (about a second per 40 MiB here): say so first.
LONG_FOLD_BYTES = 256 * 2**20
# The columns the fold reads, with their DuckDB types: missing ones read as NULL.
COLUMNS = FOLD_COLUMNS
# The kinds of event whose rows a fragment-backed batch still reads, ends.sql's facts,
# and the columns its facts macros read of them: the others are not read at all (each
# column costs a decode of every row group, where these rows are scattered).
FACT_KINDS = "'job', 'worker', 'node', 'agent'"
# DuckDB checks `kind IN (...)` only after decoding every projected column of every row;
# `kind <> x` it checks in the scan, before the other columns: so the kinds that are
# most of a lake's rows are left out that way first (10 million events, 80% tasks:
# the facts' read 0.48 -> 0.27 CPU s). The IN still decides.
BULK_KINDS = " AND ".join(f"kind <> '{kind}'" for kind in ("task", "op", "span"))
FACT_COLUMNS = frozenset({"kind", "time", "state", "job_id", "worker_id", "node_id", "host",
                          "attrs"})
__all__ = ["Cover", "TaskFold", "cache_file", "default_cache_dir", "parse_covers"]
SourceFor = Callable[[duckdb.DuckDBPyConnection, Listing], str]
FragmentSourceFor = Callable[[duckdb.DuckDBPyConnection, list[FileEntry]], str]
# What compacted files say they cover, by path (every file asked for is answered).
CoversOf = Callable[[duckdb.DuckDBPyConnection, list[FileEntry]], dict[str, set[Cover]]]


class TaskFold:
    def __init__(self, con: duckdb.DuckDBPyConnection, key: str, cache_dir: str | None,
                 on_long_fold: Callable[[str], None] | None = None,
                 placed_source: fold_place.PlacedSource | None = None,
                 only_file: Path | None = None) -> None:
        """placed_source: how to read fragments where they are (a local lake); None
        copies them into the cache. only_file: that cache file alone (the copy of
        fold_copy.py), not the first free one of cache_dir."""
        self.key = key
        self.placed_source = placed_source
        self.placed = 0  # fragments read in place now, not copied yet
        self.on_long_fold = on_long_fold
        self.sql = sql_sections()
        self.sql["macros"] = task_fold_macros() + self.sql["macros"]
        self.ends_sql = sql_sections("ends.sql")
        self.keys_sql = read_sql("keys.sql")
        self.version = hashlib.blake2b(
            (FORMAT + "".join(self.sql.values()) + self.ends_sql["macros"]
             + self.keys_sql).encode(), digest_size=8).hexdigest()
        self.path, self.note = attach_cache(con, key, cache_dir, only=only_file)
        # shared by every cursor: the views use them too
        con.execute(self.keys_sql + self.ends_sql["macros"] + self.sql["shared"])
        self.generation = 0
        self.rebuilds = 0
        self.folded_files = 0  # read and folded by this process
        self.adopted_files = 0  # compacted files whose rows were all folded already
        self.fragment_files = 0  # compacted files whose tasks came from their fragment
        # DuckDB's threads before a small batch set them to 1 (0: unchanged): the
        # statements that scan a whole stored table run on these again.
        self.scan_threads = 0
        cur = con.cursor()
        try:
            self._prepare(cur)
            self._check_version(cur)
            self.placed = fold_place.bind(cur, self.placed_source)
        finally:
            cur.close()

    # -- opening ---------------------------------------------------------------------

    def _prepare(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Connection-local helpers (temp macros, the empty source) on one cursor."""
        empty = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in COLUMNS.items())
        cur.execute(f"CREATE OR REPLACE TEMP VIEW fold_empty AS SELECT {empty} WHERE false")
        cur.execute(self.sql["macros"])
        cur.execute("CREATE OR REPLACE TEMP VIEW fold_empty_partial AS "
                    "SELECT * FROM fold_partial_of('fold_empty')")
        cur.execute("CREATE OR REPLACE TEMP VIEW fold_empty_signed AS "
                    "SELECT 1 AS sign, * FROM fold_finish_of('fold_empty_partial')")
        cur.execute("CREATE OR REPLACE TEMP VIEW fold_signed_placed AS "
                    "SELECT * FROM fold_empty_signed")

    def _check_version(self, cur: duckdb.DuckDBPyConnection) -> None:
        cur.execute(self.sql["schema"])
        found = dict(cur.execute("SELECT key, value FROM fold.meta").fetchall())
        if found.get("version") == self.version and found.get("location") == self.key:
            self.generation = int(found.get("generation", "0"))
            return
        if found:
            log.info("task cache %s: new format or location, rebuilding", self.path)
        self._reset(cur)

    def _reset(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.generation += 1  # never reuse a generation another state had
        cur.execute(self.sql["drop"])
        cur.execute(self.sql["schema"])
        cur.execute("INSERT INTO fold.meta VALUES ('version', $v), ('location', $l), "
                    "('generation', $g)",
                    {"v": self.version, "l": self.key, "g": str(self.generation)})
        self.placed = fold_place.bind(cur, self.placed_source)

    def _rebuild(self, cur: duckdb.DuckDBPyConnection, listed: dict[str, FileEntry],
                 known: dict[str, set[Cover]]) -> None:
        """Start the fold again, keeping the covers read of the listed compacted files."""
        self.rebuilds += 1
        self._reset(cur)
        insert(cur, "fold.covers", [(p, n, s) for p in listed if p in known for n, s in known[p]])

    def view_texts(self) -> dict[str, str]:
        """What the store's views.create_views runs in place of tasks.sql and ends.sql:
        task_attempts and the ends' facts over the fold, the ends over them and the
        counts over those, so that the views after them bind against the fold's tables.
        Bound over every event first, they cost most of a first open's 0.6 CPU s of
        views."""
        return {"tasks.sql": self.sql["views"],
                "ends.sql": self.ends_sql["macros"] + self.ends_sql["overlay"]
                + self.sql["counts"]}

    def create_views(self, con: duckdb.DuckDBPyConnection) -> None:
        """task_attempts over the fold, ends.sql's `tasks` over it, then what reads that."""
        for text in self.view_texts().values():
            con.execute(text)

    # -- folding ---------------------------------------------------------------------

    def sync(self, cur: duckdb.DuckDBPyConnection, listing: Listing, source_for: SourceFor,
             covers_of: CoversOf, fragment_source_for: FragmentSourceFor | None = None) -> int:
        """Fold what `listing` has and the fold lacks; returns the files folded."""
        self._prepare(cur)
        folded = dict(cur.execute("SELECT path, size FROM fold.files").fetchall())
        known = self._known_covers(cur)
        listed = {f.path: f for f in listing.files}
        new_covers: list[tuple[object, ...]] = []
        # read what each new compacted file covers, once (their footers in one go)
        unread = [e for e in listing.files if is_compacted(e) and e.path not in known]
        for path, covers in covers_of(cur, unread).items():
            known[path] = covers
            new_covers += [(path, n, s) for n, s in covers]
        insert(cur, "fold.covers", new_covers)
        gone = [p for p, size in folded.items() if p not in listed or listed[p].size != size]
        held = held_by_folder(known, listed)
        if gone and not all(explained(p, folded[p], known, held) for p in gone):
            log.info("%d folded files of %s vanished unexplained: refolding", len(gone),
                     self.key)
            self._rebuild(cur, listed, known)
            return self.sync(cur, listing, source_for, covers_of, fragment_source_for)
        lost = fold_place.changed(cur, listing)
        if lost:  # their attempts were nowhere else
            log.info("%d task fragments of %s read in place, or their compacted files, "
                     "vanished or changed: refolding", len(lost), self.key)
            self._rebuild(cur, listed, known)
            return self.sync(cur, listing, source_for, covers_of, fragment_source_for)
        covered = coverage(folded, known)
        fresh = [f for f in listing.files if folded.get(f.path) != f.size]
        adopted = {f.path for f in fresh if is_compacted(f) and known.get(f.path)
                   and known[f.path] <= covered.get(parent_and_name(f.path)[0], set())}
        todo = [f for f in fresh if f.path not in adopted]
        from_fragment = by_fragment(todo, listing, known, covered) if fragment_source_for else {}
        if self._would_mix(cur, todo, from_fragment):
            log.info("a compacted file of %s must be read whose hour was folded from its "
                     "task fragment: refolding", self.key)
            self._rebuild(cur, listed, known)
            return self.sync(cur, listing, source_for, covers_of, fragment_source_for)
        self._announce([f for f in todo if f.path not in from_fragment], first=not folded)
        self._forget(cur, gone, listed)
        # Every row of an adopted file is folded already: refolding it would change nothing.
        insert(cur, "fold.files", [(f.path, f.size) for f in fresh if f.path in adopted])
        for batch in batches([f for f in todo if f.path in from_fragment]):
            self._fold_fragment_batch(cur, Listing(tuple(batch), listing.hive),
                                      [from_fragment[f.path] for f in batch], source_for,
                                      fragment_source_for)
        for batch in batches([f for f in todo if f.path not in from_fragment]):
            self._fold_batch(cur, Listing(tuple(batch), listing.hive), source_for)
        self.folded_files += len(todo)
        self.fragment_files += len(from_fragment)
        self.adopted_files += len(adopted)
        if gone or fresh:
            self._bump(cur)
        return len(todo)

    def _announce(self, todo: list[FileEntry], first: bool) -> None:
        size = sum(f.size for f in todo)
        if self.on_long_fold is None or size < LONG_FOLD_BYTES:
            return
        where = f"the task cache {self.path}" if self.path else "tasks in memory"
        once = "; once: later queries fold only new files" if first and self.path else ""
        self.on_long_fold(f"folding {len(todo)} files ({size / 2**20:,.0f} MiB) into "
                          f"{where}{once}")

    def _would_mix(self, cur: duckdb.DuckDBPyConnection, todo: list[FileEntry],
                   by_fragment: dict[str, FileEntry]) -> bool:
        """Whether a compacted file must be folded from its rows in a folder whose tasks
        came from a fragment (an hour merged again with a late file, its fragment
        missing): no hash of the fragment's events is in `seen`, so its rows would be
        counted twice. Rare; refolding from the fragments costs little."""
        raw_folders = {parent_and_name(f.path)[0] for f in todo
                       if is_compacted(f) and f.path not in by_fragment}
        if not raw_folders:
            return False
        from_fragments = {parent_and_name(p)[0] for p, in cur.execute(
            "SELECT path FROM fold.from_fragments").fetchall()}
        return bool(raw_folders & from_fragments)

    def _known_covers(self, cur: duckdb.DuckDBPyConnection) -> dict[str, set[Cover]]:
        known: dict[str, set[Cover]] = {}
        for path, name, size in cur.execute("SELECT path, name, size FROM fold.covers").fetchall():
            known.setdefault(path, set()).add((name, size))
        return known

    def _forget(self, cur: duckdb.DuckDBPyConnection, gone: list[str],
                listed: dict[str, FileEntry]) -> None:
        stale = [p for p, in cur.execute("SELECT DISTINCT path FROM fold.covers").fetchall()
                 if p not in listed]
        for table, paths in (("fold.files", gone), ("fold.covers", stale),
                             ("fold.from_fragments", gone)):
            if paths:
                cur.execute(f"DELETE FROM {table} WHERE path IN (SELECT unnest($paths))",
                            {"paths": paths})

    def _fold_batch(self, cur: duckdb.DuckDBPyConnection, batch: Listing,
                    source_for: SourceFor) -> None:
        source = source_for(cur, batch)
        present = {row[0] for row in cur.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        projection = ", ".join(project(c, t, c in present) for c, t in COLUMNS.items())
        cur.execute(f"CREATE OR REPLACE TEMP VIEW fold_rows AS SELECT {projection} "
                    f"FROM {source}")
        small = sum(f.size for f in batch.files) < SMALL_BATCH_BYTES
        with threads(cur, 1 if small else 0) as before:
            self.scan_threads = before
            self._fold_rows(cur, batch)
        log.debug("folded %d files of %s", len(batch.files), self.key)

    def _fold_fragment_batch(self, cur: duckdb.DuckDBPyConnection, batch: Listing,
                             fragments: list[FileEntry], source_for: SourceFor,
                             fragment_source_for: FragmentSourceFor | None) -> None:
        """Compacted files whose tasks are their fragments merged (fold.sql
        @kinds_timeline): of their rows only the facts' few are read, and kind and time
        (the timeline). With a placed_source the fragments stay where they are and only
        the attempts that must be merged are stored (@fragments_placed), and the timeline
        is left to the copy (fold_place.py); else every attempt is copied, and the
        timeline counted."""
        source = source_for(cur, batch)
        present = {row[0] for row in cur.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        projection = ", ".join(project(c, t, c in present & FACT_COLUMNS)
                               for c, t in COLUMNS.items())
        cur.execute(f"CREATE OR REPLACE TEMP VIEW fold_rows AS SELECT {projection} "
                    f"FROM {source} WHERE {BULK_KINDS} AND kind IN ({FACT_KINDS})")
        in_place = self.placed_source is not None
        if not in_place:
            cur.execute(f"CREATE OR REPLACE TEMP VIEW fold_kinds AS SELECT kind, "
                        f"{micros('time')} AS time FROM {source}")
        assert fragment_source_for is not None  # by_fragment is empty without it
        parts = fragment_source_for(cur, fragments)
        cur.execute(f"CREATE OR REPLACE TEMP VIEW fold_fragment_parts AS SELECT * FROM {parts}")
        small = sum(f.size for f in fragments) < SMALL_BATCH_BYTES // 8
        with threads(cur, 1 if small else 0) as before:
            self.scan_threads = before
            cur.execute("BEGIN TRANSACTION")
            try:
                held = _rows_held(cur)
                if not in_place:
                    cur.execute(self.sql["kinds_timeline"])
                cur.execute(self.sql["facts"])
                cur.execute(self.sql["fragment_hosts"])
                if in_place:
                    cur.execute(self.sql["fragments_placed"])
                    if held:
                        with threads(cur, self.scan_threads):  # hashes every held key
                            cur.execute(self.sql["fragments_placed_hits"])
                    cur.execute(self.sql["fragments_placed_split"])
                    fold_place.place(cur, batch.files, fragments)
                else:
                    cur.execute(self.sql["fragments_copied"])
                self._fold_tasks(cur, held)
                cur.execute(self.sql["bins"])
                insert(cur, "fold.files", [(f.path, f.size) for f in batch.files])
                insert(cur, "fold.from_fragments", [(f.path,) for f in batch.files])
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            finally:
                cur.execute(self.sql["cleanup"])
        if in_place:  # the views name the fragments: now these too
            self.placed = fold_place.bind(cur, self.placed_source)
        log.debug("folded %d files of %s from their task fragments", len(batch.files),
                  self.key)

    def _fold_rows(self, cur: duckdb.DuckDBPyConnection, batch: Listing) -> None:
        cur.execute("BEGIN TRANSACTION")
        try:
            found = cur.execute("SELECT count(*) FROM fold.seen").fetchone()
            seen = found[0] if found else 0
            tasks = _rows_held(cur)
            cur.execute(self.sql["ids"])
            if seen:
                with threads(cur, self.scan_threads):  # scans `seen`: every thread helps
                    cur.execute(self.sql["counted"])
            cur.execute(self.sql["batch"])
            cur.execute(self.sql["facts"])
            self._fold_tasks(cur, tasks)
            cur.execute(self.sql["bins"])
            insert(cur, "fold.files", [(f.path, f.size) for f in batch.files])
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.execute(self.sql["cleanup"])

    def _fold_tasks(self, cur: duckdb.DuckDBPyConnection, held: int) -> None:
        """The batch's task rows into task_fold: appended when the fold holds no rows
        (stored or in place); else merged with the rows they touch, or, touching none,
        inserted as they are."""
        if not held:
            cur.execute(self.sql["append"])
            return
        cur.execute(self.sql["merge_batch"])
        with threads(cur, self.scan_threads):  # scans task_fold's k (and the placed keys)
            cur.execute(self.sql["hit"])
        hits = cur.execute("SELECT (SELECT count(*) FROM fold_hit) "
                           "+ (SELECT count(*) FROM fold_hit_placed)").fetchone()
        cur.execute(self.sql["merge" if hits and hits[0] else "fresh"])

    def persist(self, cur: duckdb.DuckDBPyConnection) -> int:
        """Copy the rows read in place into the cache table (fold.sql @persist), and count
        their compacted files' timeline into fold.timeline (@placed_kinds); returns how
        many fragments were read in place before. Answers do not change."""
        placed = len(fold_place.placed(cur))
        if not placed:
            return 0
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute(self.sql["placed_kinds"])
            cur.execute(self.sql["kinds_timeline"])
            cur.execute(self.sql["persist"])
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        self.placed = fold_place.bind(cur, self.placed_source)
        log.debug("copied the tasks of %d fragments of %s into its cache", placed, self.key)
        return placed

    def placed_bytes(self, cur: duckdb.DuckDBPyConnection) -> int:
        """The size of the fragments read in place, not copied yet."""
        found = cur.execute("SELECT coalesce(sum(size), 0) FROM fold.placed").fetchone()
        return int(found[0]) if found else 0

    def _bump(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.generation += 1
        cur.execute("UPDATE fold.meta SET value = $g WHERE key = 'generation'",
                    {"g": str(self.generation)})

    # -- reading ---------------------------------------------------------------------

    def summary_table(self, cur: duckdb.DuckDBPyConnection) -> str:
        """The name of a table holding task_summary's rows for the current fold."""
        found = cur.execute("SELECT value FROM fold.meta WHERE key = 'summary'").fetchone()
        # ends.sql's ends change with the clock too (an agent falls silent), not only
        # with new files: the kept summary is for one generation and one set of ends.
        # task_ends once, as a table: its size known, the joins with it read the fold's
        # rows only where it has any (fold.sql @summary)
        cur.execute("CREATE OR REPLACE TEMP TABLE fold_ends_now AS SELECT * FROM task_ends")
        try:
            ends = cur.execute("SELECT count(*), max(end_at) FROM fold_ends_now").fetchone()
            key = f"{self.generation}:{ends}"
            if found is None or found[0] != key:
                self._prepare(cur)
                cur.execute(self.sql["summary"])
                bins = [int(b) for b, in cur.execute("SELECT DISTINCT bin FROM fold_wanted"
                                                      ).fetchall()]
                # integers read back from the fold, never outside text
                cur.execute(self.sql["summary_table"].replace(
                    "@bins", ", ".join(map(str, bins)) or "NULL"))
                cur.execute(self.sql["summary_done"])
                cur.execute("DELETE FROM fold.meta WHERE key = 'summary'")
                cur.execute("INSERT INTO fold.meta VALUES ('summary', $g)", {"g": key})
        finally:
            cur.execute("DROP TABLE IF EXISTS fold_ends_now")
        return "fold.summary"

    def close(self, con: duckdb.DuckDBPyConnection) -> None:
        """Checkpoint a WAL left by an earlier process's fold when this one folded
        nothing: every open replays the WAL, so a location queried at rest pays it once,
        here, rather than on every query. A process that folded leaves its own WAL."""
        if self.path is None or self.folded_files or self.adopted_files or self.rebuilds:
            return
        wal = Path(f"{self.path}.wal")
        if wal.exists() and wal.stat().st_size > 0:
            con.execute("CHECKPOINT fold")

    def describe(self) -> dict[str, object]:
        return {"cache": str(self.path) if self.path else "memory", "note": self.note,
                "generation": self.generation, "rebuilds": self.rebuilds,
                "folded_files": self.folded_files, "adopted_files": self.adopted_files,
                "fragment_files": self.fragment_files,
                "in_place": self.placed_source is not None, "placed": self.placed}


def _rows_held(cur: duckdb.DuckDBPyConnection) -> int:
    """Whether the fold holds task rows, stored or in place (0: none)."""
    found = cur.execute("SELECT (SELECT count(*) FROM fold.task_fold) "
                        "+ (SELECT count(*) FROM fold.placed)").fetchone()
    return int(found[0]) if found else 0


