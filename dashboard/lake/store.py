"""One DuckDB connection over one evagg store (a local directory or an s3:// prefix).

The store lists its Parquet files (at most every `refresh_s` seconds), builds the
`events_raw` relation over exactly that list and (re)creates the views when the list
changed, so new files appear without a restart and one connection serves every query.
Engines: "local" (DuckDB reads the files), "httpfs" (DuckDB reads s3:// itself) and
"pyarrow" (pyarrow's filesystem and dataset, registered in DuckDB; the S3 fallback).
Where and how the files are read (engine choice, listing, rotating credentials) is the
store's source object (dashboard/lake/sources/); the store itself never asks which it has.
With `fold` on (the default), `tasks` reads the incrementally folded task table of
dashboard/lake/fold.py instead of folding every task event on every query.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from dashboard.lake import fold_handover, views
from dashboard.lake.cancel import current_token
from dashboard.lake.errors import BadInput, NoData, QueryFailed, StoreUnavailable
from dashboard.lake.fold import Cover, TaskFold, parse_covers
from dashboard.lake.fold_sql import lake_connection, read_local
from dashboard.lake.listing import FileEntry, Listing
from dashboard.lake.results import Result, from_cursor
from dashboard.lake.sources import ENGINES, Relation, fragments_sql, open_source
from sinks.parquet.layout import COMPACTION_META_KEY

log = logging.getLogger("evagg.dashboard.lake")
DATASET_NAME = "evagg_dataset"
BATCH_DATASET = "evagg_fold_batch"
FRAGMENT_DATASET = "evagg_fold_fragments"
FOLD_VIEWS = ("tasks", "event_timeline", "task_state_counts")


@dataclass(frozen=True, slots=True)
class StoreOptions:
    location: str
    endpoint_url: str | None = None
    region: str | None = None
    engine: str = "auto"  # auto: DuckDB itself (httpfs for S3), pyarrow when httpfs fails
    refresh_s: float = 5.0
    fold: bool = True  # tasks from the incremental fold; False: tasks.sql over every event
    cache_dir: str | None = None  # where the fold's cache file lives; None: memory only
    # Told once when the fold is about to read a lot (a first query of a large store).
    on_long_fold: Callable[[str], None] | None = None
    # A first open answers from task fragments read in place (a local lake); the fold then
    # copies them into its cache, for later queries: in a thread right after (a
    # dashboard), else when the store closes (once a command's answer is out), or, with
    # persist_after_exit, in a process of its own after that.
    persist_in_background: bool = False
    # A command: the copy at close goes to a process of its own (dashboard/lake/
    # fold_copy.py), so the command exits once its answer is out; small copies stay inline.
    persist_after_exit: bool = False


class Store:
    def __init__(self, options: StoreOptions) -> None:
        if options.engine not in ENGINES:
            raise BadInput(f"unknown engine {options.engine!r} (choose from {', '.join(ENGINES)})")
        self.options = options
        self.location = options.location
        self.note = ""
        self._lock = threading.RLock()
        self._fold_lock = threading.Lock()  # a fold's writes: a sync, or persisting one
        self._persister: threading.Thread | None = None
        self._closed = False
        self._listing: Listing | None = None
        self._listed_at = float("-inf")
        self._built_for: str | None = None
        self._built_schema: list[tuple[str, str]] | None = None  # events_raw's, once built
        self._synced_for: str | None = None
        self._relation = Relation("")  # what the views read; registered on every cursor
        self._columns: dict[str, list[str]] = {}
        self._con = lake_connection()
        self._source = open_source(options.location, options.endpoint_url, options.region,
                                   options.engine, self._con)
        self.engine = self._source.engine
        if self.engine == "local":
            read_local(self._con)
        self.note = self._source.note
        self.fold: TaskFold | None = None
        if options.fold:
            self.fold = TaskFold(self._con, self._source.cache_key, options.cache_dir,
                                 on_long_fold=options.on_long_fold,
                                 placed_source=(fragments_sql if
                                                self._source.fragments_in_place else None))
            self.fold.create_views(self._con)
            self.note = "; ".join(n for n in (self.note, self.fold.note) if n)

    # -- listing and views -----------------------------------------------------------

    def refresh(self, *, force: bool = False, views: bool = True) -> Listing:
        """The current listing; relists when due, folds new files and rebuilds the views
        when files changed. views=False leaves the views for later: binding them reads
        every file's footer, and what reads only the fold needs none of them."""
        with self._lock:
            due = time.monotonic() - self._listed_at >= self.options.refresh_s
            if self._listing is None or force or due:
                listing = self._list()
                self._listed_at = time.monotonic()
                self._listing = listing
                if listing.files and listing.fingerprint != self._synced_for:
                    self._synced_for = self._sync(listing).fingerprint
            listing = self._listing
            if views and listing.files and listing.fingerprint != self._built_for:
                self._build(listing)
            return self._require_files(listing)

    def _require_files(self, listing: Listing) -> Listing:
        if not listing.files:
            raise NoData(f"no Parquet files under {self.location} yet")
        return listing

    def _list(self) -> Listing:
        if self._source.follow_credentials(self._con):
            self._built_for = None  # the views' relation holds the old credentials: rebuild
        return self._source.list()

    def _sync(self, listing: Listing) -> Listing:
        """Fold the files the task fold has not seen; a file gone mid-read relists once.
        Returns the listing folded."""
        if self.fold is None:
            return listing
        for attempt in range(2):
            cursor = self._con.cursor()
            try:
                with self._fold_lock:
                    self.fold.sync(cursor, listing, self._batch_source, self._covers_of,
                                   self._fragment_source)
                if self.options.persist_in_background and self.fold.placed:
                    self._persist_soon()
                return listing
            except duckdb.IOException as exc:
                if attempt:
                    raise StoreUnavailable(f"reading {self.location} failed: {exc}") from None
                listing = self._listing = self._list()
            except duckdb.Error as exc:
                raise StoreUnavailable(f"folding tasks of {self.location} failed: {exc}"
                                       ) from None
            finally:
                cursor.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _batch_source(self, cursor: duckdb.DuckDBPyConnection, batch: Listing) -> str:
        relation = self._source.relation(batch, BATCH_DATASET)
        relation.register(cursor)
        return relation.sql

    def _fragment_source(self, cursor: duckdb.DuckDBPyConnection,
                         fragments: list[FileEntry]) -> str:
        relation = self._source.fragment_relation(fragments, FRAGMENT_DATASET)
        relation.register(cursor)
        return relation.sql

    def _covers_of(self, cursor: duckdb.DuckDBPyConnection, entries: list[FileEntry]
                   ) -> dict[str, set[Cover]]:
        """What compacted files say they cover, from their Parquet footers: all in one
        read, else (one cannot be read) file by file."""
        try:
            found = self._source.kv_metadata_of(cursor, entries, COMPACTION_META_KEY)
            return {path: parse_covers(value) for path, value in found.items()}
        except (OSError, duckdb.Error):
            return {entry.path: self._covers_of_one(cursor, entry) for entry in entries}

    def _covers_of_one(self, cursor: duckdb.DuckDBPyConnection, entry: FileEntry) -> set[Cover]:
        try:
            return parse_covers(self._source.kv_metadata(cursor, entry, COMPACTION_META_KEY))
        except (OSError, duckdb.Error) as exc:  # unreadable: it explains nothing
            log.warning("cannot read the footer of %s: %s", entry.path, exc)
            return set()

    def _build(self, listing: Listing) -> None:
        relation = self._source.relation(listing, DATASET_NAME)
        relation.register(self._con)
        self._relation = relation
        if self._built_schema is not None:  # the views stand: point them at the new files
            views.replace_source(self._con, relation.sql)
        if (self._built_schema is None
                or views.view_schema(self._con, views.SOURCE_VIEW) != self._built_schema):
            # a first build, or files with other columns: the `SELECT *` views bind again
            views.create_views(self._con, relation.sql,
                               self.fold.view_texts() if self.fold is not None else None)
            self._built_schema = views.view_schema(self._con, views.SOURCE_VIEW)
        self._columns.clear()
        self._built_for = listing.fingerprint
        log.debug("views over %d files of %s (%s)", len(listing.files), self.location, self.engine)

    # -- queries ---------------------------------------------------------------------

    def execute(
        self,
        sql: str,
        params: dict[str, Any] | None = None,
        *,
        on_cursor: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
        user_sql: bool = False,
        views: bool = True,
    ) -> Result:
        """Run one query (parameters bound by DuckDB, never pasted) on a fresh cursor;
        views=False for SQL that reads only the fold's tables and views."""
        self.refresh(views=views)
        token = current_token()
        for attempt in range(2):
            cursor = self._cursor()
            try:
                if token is not None:
                    token.attach(cursor)
                if on_cursor is not None:
                    on_cursor(cursor)
                cursor.execute(sql, params or {})
                if cursor.description is None:  # a statement without rows (user SQL)
                    return Result([], [])
                return from_cursor(cursor)
            except duckdb.IOException as exc:
                if attempt:  # a file listed a moment ago is gone: relist once, then give up
                    raise StoreUnavailable(f"reading {self.location} failed: {exc}") from None
                self.refresh(force=True, views=views)
            except duckdb.InterruptException:
                reason = token.reason if token else "the query was cancelled"
                raise StoreUnavailable(reason) from None
            except duckdb.Error as exc:
                if user_sql:
                    raise BadInput(str(exc)) from None
                raise QueryFailed(f"query failed: {exc}") from None
            finally:
                if token is not None:
                    token.detach()
                cursor.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            cursor = self._con.cursor()
            self._relation.register(cursor)  # registrations are per cursor
            return cursor

    def columns(self, view: str) -> list[str]:
        """Column names of one view, read once per build."""
        self.refresh(views=not self.fold_view(view))
        with self._lock:
            if view not in self._columns:
                self._columns[view] = views.view_columns(self._con, view)
            return self._columns[view]

    def fold_view(self, view: str) -> bool:
        """Whether `view` reads only the task fold (so needs no view over the files)."""
        return self.fold is not None and view in FOLD_VIEWS

    def summary_relation(self) -> str:
        """Where task_summary's rows are: with the fold, a table kept until the fold
        changes (the quantiles sort every task once per dimension); else the view."""
        if self.fold is None:
            return "task_summary"
        self.refresh(views=False)
        with self._lock:
            cursor = self._con.cursor()
            try:
                return self.fold.summary_table(cursor)
            except duckdb.Error as exc:
                raise QueryFailed(f"query failed: {exc}") from None
            finally:
                cursor.close()

    def describe(self) -> dict[str, Any]:
        listing = self._listing
        return {
            "location": self.location,
            "engine": self.engine,
            "note": self.note,
            "files": len(listing.files) if listing else 0,
            "bytes": listing.total_bytes if listing else 0,
            "ignored_files": listing.ignored if listing else 0,
            "version": listing.fingerprint if listing else "",
            "task_cache": self.fold.describe()["cache"] if self.fold else "off",
        }

    @property
    def version(self) -> str:
        return self.refresh().fingerprint

    def persist_fold(self) -> int:
        """Copy the task fragments the fold reads in place into its cache (a no-op when
        there are none); returns how many there were. Queries meanwhile read them in
        place; they see the table from its commit on, with the same answers."""
        if self.fold is None:
            return 0
        with self._lock:
            cursor = self._con.cursor()
        try:
            with self._fold_lock:
                return self.fold.persist(cursor)
        except duckdb.Error as exc:  # a fragment gone: the next sync rebuilds
            log.warning("copying task fragments into the task cache failed: %s", exc)
            return 0
        finally:
            cursor.close()

    def _persist_soon(self) -> None:
        if self._persister is not None and self._persister.is_alive():
            return
        self._persister = threading.Thread(target=self.persist_fold, daemon=True,
                                           name="evagg-fold-persist")
        self._persister.start()

    def close(self) -> None:
        """Closes the connection; first copies fragments read in place into a cache
        file, for the next process (memory goes with this one), or, with
        persist_after_exit, has a process of its own copy them once the file is closed."""
        if self._closed:
            return
        if self._persister is not None:
            self._persister.join()
        detach = False
        if self.fold is not None and self.fold.path is not None and self.fold.placed:
            detach = self.options.persist_after_exit and self._placed_bytes() >= \
                fold_handover.COPY_AFTER_EXIT_BYTES
            if not detach:
                self.persist_fold()
        with self._lock:
            self._closed = True
            if self.fold is not None and not detach:  # the copy checkpoints after it
                try:
                    self.fold.close(self._con)
                except duckdb.Error as exc:  # the WAL stays; the next open replays it
                    log.warning("task cache checkpoint failed: %s", exc)
            self._con.close()
        if (detach and self.fold is not None and self.fold.path is not None
                and not fold_handover.spawn(self.fold.path, self.fold.key)):
            log.warning("could not start the copy of task fragments into %s; the next "
                        "query reads them in place", self.fold.path)

    def _placed_bytes(self) -> int:
        assert self.fold is not None
        cursor = self._con.cursor()
        try:
            return self.fold.placed_bytes(cursor)
        except duckdb.Error:
            return 0
        finally:
            cursor.close()


__all__ = ["ENGINES", "Store", "StoreOptions"]
