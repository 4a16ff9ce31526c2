"""The copy of the task fragments read in place into a cache file, in a process of its
own once `evagg query` has exited (dashboard/lake/fold_place.py, Store.close).

A first `evagg query` of a local lake answers from the fragments where they are; the
copy that makes later queries as fast as before (fold.sql @persist) took longer than the
answer (4 s of a 10 s command at 10 million events). So the command hands it to a child
process and exits: `python -m dashboard.lake.fold_copy CACHE_FILE KEY` attaches that
cache file alone, copies, checkpoints, and exits, giving the file up at once to any
process that asks for it (fold_handover.py).

Nothing is lost if the copy is interrupted or killed: its transaction never commits,
the rows stay read in place (committed by the command before it started), and the next
process to close the store copies them again.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
from contextlib import suppress
from pathlib import Path

import duckdb

from dashboard.lake import fold_handover
from dashboard.lake.fold import TaskFold
from dashboard.lake.fold_sql import lake_connection, read_local
from dashboard.lake.sources import fragments_sql


def copy(path: Path, key: str) -> str:
    """Copy the rows read in place into the cache file `path`, unless another process
    holds or wants it; returns what happened (also written to the copy's marker)."""
    fd = os.open(fold_handover.marker(path, "copy"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "another copy runs"
        fold_handover.say(fd, f"started {os.getpid()}")  # whose lock: fold_handover.stopped
        if fold_handover.wanted(path):
            fold_handover.say(fd, "yielded")
            return "yielded"
        con = lake_connection()
        read_local(con)  # only a local lake's fragments are read in place, then copied
        try:
            try:
                fold = TaskFold(con, key, str(path.parent), placed_source=fragments_sql,
                                only_file=path)
            except duckdb.Error as exc:  # held by a process that came first, or damaged
                said = f"gave up: {str(exc).splitlines()[0]}"
                fold_handover.say(fd, said)
                return said
            fold_handover.say(fd, f"copying {os.getpid()}")
            said = _copy_unless_wanted(con, fold, path)
            fold_handover.say(fd, said)
            return said
        finally:
            con.close()
    finally:
        os.close(fd)


def _copy_unless_wanted(con: duckdb.DuckDBPyConnection, fold: TaskFold, path: Path) -> str:
    """fold.persist on `con` itself (so that interrupt() reaches it), with a watcher that
    interrupts it when a process wants the file; then a checkpoint, so the next process
    opens the file without replaying the WAL."""
    done = threading.Event()
    wanted = threading.Event()

    def watch() -> None:
        while not done.wait(fold_handover.POLL_S):
            if wanted.is_set() or fold_handover.wanted(path):
                wanted.set()
                con.interrupt()  # again each time: one between two statements is lost

    watcher = threading.Thread(target=watch, name="evagg-fold-copy-watch", daemon=True)
    watcher.start()
    placed: int | None = None
    try:
        placed = fold.persist(con)  # committed: from here on the copy is done
        if not wanted.is_set():
            fold.close(con)  # the checkpoint: this process folded nothing
    except duckdb.InterruptException:
        pass
    except duckdb.Error as exc:  # a fragment gone: the next open rebuilds
        if placed is None:
            return f"gave up: {str(exc).splitlines()[0]}"
    finally:
        done.set()
        watcher.join()
    return "yielded" if placed is None else f"copied {placed}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dashboard.lake.fold_copy CACHE_FILE KEY", file=sys.stderr)
        return 2
    with suppress(OSError):
        os.nice(10)  # the user's next command comes first
    copy(Path(argv[0]), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
