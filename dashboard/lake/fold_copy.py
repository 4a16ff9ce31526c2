"""The copy of the task fragments read in place into a cache file, in a process of its
own once `evagg query` has exited (dashboard/lake/fold_place.py, Store.close).

A first `evagg query` of a local lake answers from the fragments where they are; the
copy that makes later queries as fast as before (fold.sql @persist) took longer than the
answer (4 s of a 10 s command at 10 million events). So the command hands it to a child
process and exits: `python -m dashboard.lake.fold_copy CACHE_FILE KEY` attaches that
cache file alone, copies, checkpoints, and exits.

DuckDB lets one process write a file, so the copy gives the file up to any process that
wants it. Two lock files beside the cache file (flock, released by the kernel when their
holder exits, however it exits):

- `CACHE_FILE.copy`: held by the copy for its whole life; it also says what the copy
  did (`copying PID`, then `copied N`, `yielded` or `gave up: WHY`).
- `CACHE_FILE.yield`: held (shared) by a process that found the cache file held by a
  copy (`yielded`). The copy looks every POLL_S seconds and, when it is held, interrupts
  its statement and exits; that process then attaches the file (fold_cache.py).

Nothing is lost if the copy is interrupted or killed: its transaction never commits,
the rows stay read in place (committed by the command before it started), and the next
process to close the store copies them again.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from dashboard.lake.fold import TaskFold

# Fragments read in place smaller than this are copied by the command itself, at close:
# starting a process would cost more than the copy (about 50 ms per MiB here).
COPY_AFTER_EXIT_BYTES = 4 * 2**20
POLL_S = 0.02  # how often the copy looks whether a process wants its file
YIELD_WAIT_S = 30.0  # how long a process waits for a copy to give the file up


def marker(path: Path, what: str) -> Path:
    return Path(f"{path}.{what}")


def _held(path: Path, *, shared: bool = False) -> bool:
    """Whether another open file holds a lock on `path` (False when it does not exist):
    an exclusive one, or with `shared` any (a shared lock does not stop another)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if shared else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases a lock it took
    return False


def state(path: Path) -> str:
    """What the last copy of the cache file `path` wrote of itself ('' if none ran)."""
    try:
        return marker(path, "copy").read_text("utf-8").strip()
    except OSError:
        return ""


def copying(path: Path) -> bool:
    """Whether a copy process holds `path`'s copy lock now."""
    return _held(marker(path, "copy"))


def spawn(path: Path, key: str) -> bool:
    """Start the copy of the cache file `path` (attached under `key`) in a process that
    outlives this one; returns whether it started. The caller has closed the file."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        subprocess.Popen(
            [sys.executable, "-m", "dashboard.lake.fold_copy", str(path), key],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, env=env)
    except OSError:
        return False
    return True


@contextmanager
def yielded(path: Path) -> Iterator[bool]:
    """When a copy holds the cache file `path`, ask it to give the file up and wait until
    it has exited (at most YIELD_WAIT_S); yields whether it did. The request stands for
    the whole block, so no new copy starts meanwhile."""
    if not copying(path):
        yield False
        return
    fd = os.open(marker(path, "yield"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        deadline = time.monotonic() + YIELD_WAIT_S
        while copying(path):
            if time.monotonic() > deadline:
                yield False
                return
            time.sleep(POLL_S)
        yield True
    finally:
        os.close(fd)


def _wanted(path: Path) -> bool:
    return _held(marker(path, "yield"), shared=True)


def _say(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{text}\n".encode(), 0)


def copy(path: Path, key: str) -> str:
    """Copy the rows read in place into the cache file `path`, unless another process
    holds or wants it; returns what happened (also written to the copy's marker)."""
    from dashboard.lake.fold import TaskFold  # the fold imports this module
    from dashboard.lake.sources import fragments_sql

    fd = os.open(marker(path, "copy"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "another copy runs"
        if _wanted(path):
            _say(fd, "yielded")
            return "yielded"
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET TimeZone = 'UTC'")
            con.execute("SET parquet_metadata_cache = true")
            try:
                fold = TaskFold(con, key, str(path.parent), placed_source=fragments_sql,
                                only_file=path)
            except duckdb.Error as exc:  # held by a process that came first
                said = f"gave up: {str(exc).splitlines()[0]}"
                _say(fd, said)
                return said
            _say(fd, f"copying {os.getpid()}")
            said = _copy_unless_wanted(con, fold, path)
            _say(fd, said)
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
        while not done.wait(POLL_S):
            if wanted.is_set() or _wanted(path):
                wanted.set()
                con.interrupt()  # again each time: one between two statements is lost

    watcher = threading.Thread(target=watch, name="evagg-fold-copy-watch", daemon=True)
    watcher.start()
    try:
        placed = fold.persist(con)
        if not wanted.is_set():
            fold.close(con)  # the checkpoint: this process folded nothing
    except duckdb.InterruptException:
        return "yielded"
    except duckdb.Error as exc:  # a fragment gone: the next open rebuilds
        return f"gave up: {str(exc).splitlines()[0]}"
    finally:
        done.set()
        watcher.join()
    return "yielded" if wanted.is_set() else f"copied {placed}"


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
