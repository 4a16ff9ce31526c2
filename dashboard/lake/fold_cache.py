"""Where the task fold's cache lives, and how it is opened (dashboard/lake/fold.py).

One DuckDB file per data location under the cache directory, in up to SLOTS copies:
DuckDB lets one process write a file, so a query beside a running dashboard opens the
next slot; one that the copy of fragments read in place holds (fold_handover.py) is asked
for and taken over instead. A file that is not a DuckDB database of this version is only
a cache: it is removed and started again; one another process holds is never touched.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import duckdb

from dashboard.lake import fold_handover
from dashboard.lake.s3 import sql_literal

log = logging.getLogger("evagg.dashboard.fold")  # fold.py's too: one name for the fold
SLOTS = 3  # cache files per location: processes folding the same data at once


def default_cache_dir() -> Path:
    """$EVAGG_CACHE_DIR, else $XDG_CACHE_HOME/evagg, else ~/.cache/evagg."""
    explicit = os.environ.get("EVAGG_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "evagg"


def cache_file(cache_dir: str, key: str, slot: int = 0) -> Path:
    digest = hashlib.blake2b(key.encode(), digest_size=10).hexdigest()
    return Path(cache_dir).expanduser() / f"tasks-{digest}{f'-{slot}' if slot else ''}.duckdb"


def damaged(path: Path, message: str) -> bool:
    """Whether an ATTACH failed on the file itself (not a DuckDB file, or another
    storage version) rather than because someone holds it."""
    try:
        with path.open("rb") as handle:
            header = handle.read(12)
    except OSError:
        return False
    if "lock" in message.lower() or "conflict" in message.lower():
        return False  # held: the message may name anything (a path with "version" in it)
    return header[8:12] != b"DUCK" or "version number" in message.lower()


def attach_file(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """ATTACH a cache file; one that is not a DuckDB database (damaged, or from another
    DuckDB version) is only a cache: it is removed and started again."""
    try:
        con.execute(f"ATTACH {sql_literal(str(path))} AS fold")
    except duckdb.Error as exc:
        if not damaged(path, str(exc)):
            raise  # held by another process or connection: never remove it
        log.warning("task cache %s unreadable (%s): starting it again", path,
                    str(exc).splitlines()[0])
        path.unlink(missing_ok=True)
        Path(f"{path}.wal").unlink(missing_ok=True)
        con.execute(f"ATTACH {sql_literal(str(path))} AS fold")


def attach_free(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """attach_file; when a copy of fragments read in place holds the file, it is asked
    to give it up (fold_handover.py: it exits, its copy undone) and the file is attached."""
    try:
        attach_file(con, path)
    except duckdb.Error as exc:
        with fold_handover.yielded(path) as free:
            try:  # a copy that gave the file up, or one that ended meanwhile on its own
                attach_file(con, path)
            except duckdb.Error:
                if free:
                    raise
                raise exc from None


def attach_cache(con: duckdb.DuckDBPyConnection, key: str, cache_dir: str | None,
                 only: Path | None = None) -> tuple[Path | None, str]:
    """Attach as `fold` the first cache file no other process holds (DuckDB lets one
    process write a file), so a query beside a running dashboard keeps a cache of its
    own; memory when there is no cache directory or none is usable. Returns the file
    (None for memory) and a note for the user when the cache could not be used.
    only: that cache file or none (raises duckdb.Error when it is held)."""
    if only is not None:
        attach_file(con, only)
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
        return only, ""
    if cache_dir is None:
        con.execute("ATTACH ':memory:' AS fold")
        return None, ""
    reason = ""
    for slot in range(SLOTS):
        path = cache_file(cache_dir, key, slot)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            attach_free(con, path)
            # A fold's commit stays in the WAL until it reaches DuckDB's
            # checkpoint_threshold, or a process at rest checkpoints it (close()):
            # a checkpoint on every close cost the command after a new file
            # 0.1-0.9 s. The next open replays the WAL (docs/queries.md).
            con.execute("PRAGMA disable_checkpoint_on_shutdown")
            return path, ""
        except (OSError, duckdb.Error) as exc:
            reason = str(exc).splitlines()[0]
            if not isinstance(exc, duckdb.Error):
                break  # the folder cannot be made or written
    note = f"task cache in {cache_dir} not usable ({reason}); folding in memory"
    log.warning("%s", note)
    con.execute("ATTACH ':memory:' AS fold")
    return None, note
