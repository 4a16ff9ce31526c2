"""How `evagg query` hands the copy of task fragments read in place to a process of its
own (fold_copy.py), and how any process that wants the cache file gets it back from that
copy.

DuckDB lets one process write a file, so the copy gives the file up to any process that
wants it. Two lock files beside the cache file (flock, released by the kernel when their
holder exits, however it exits):

- `CACHE_FILE.copy`: held by the copy for its whole life; it also says what the copy
  did (`started PID` once it holds the lock, `copying PID`, then `copied N`, `yielded`
  or `gave up: WHY`).
- `CACHE_FILE.yield`: held (shared) by a process that found the cache file held by a
  copy (`yielded`). The copy looks every POLL_S seconds and, when it is held, interrupts
  its statement and exits; that process then attaches the file (fold_cache.py).

A copy that is stopped (SIGSTOP, a job suspended with ^Z) cannot give the file up: the
process that wants it sees the copy's state in /proc and takes another cache file at
once (reading the fragments in place) rather than wait YIELD_WAIT_S for nothing.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Fragments read in place smaller than this are copied by the command itself, at close:
# starting a process would cost more than the copy (about 50 ms per MiB here).
COPY_AFTER_EXIT_BYTES = 4 * 2**20
POLL_S = 0.02  # how often the copy looks whether a process wants its file
YIELD_WAIT_S = 30.0  # how long a process waits for a copy to give the file up


def marker(path: Path, what: str) -> Path:
    return Path(f"{path}.{what}")


def held(path: Path, *, shared: bool = False) -> bool:
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


_COPY_MAIN = ("import sys; sys.path.append(sys.argv[1]); "
              "from dashboard.lake.fold_copy import main; sys.exit(main(sys.argv[2:]))")


def copying(path: Path) -> bool:
    """Whether a copy process holds `path`'s copy lock now."""
    return held(marker(path, "copy"))


def spawn(path: Path, key: str) -> bool:
    """Start the copy of the cache file `path` (attached under `key`) in a process that
    outlives this one; returns whether it started. The caller has closed the file."""
    # evagg's own root goes last on the child's path, where an install finds its modules
    # anyway: first (as PYTHONPATH would put it) it could shadow the standard library
    package_root = str(Path(__file__).resolve().parents[2])
    try:
        subprocess.Popen(
            [sys.executable, "-c", _COPY_MAIN, package_root, str(path), key],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
    except OSError:
        return False
    return True


def copy_pid(path: Path) -> int | None:
    """The pid the copy of `path` wrote of itself (`started PID` or `copying PID`)."""
    words = state(path).split(" ")
    if len(words) == 2 and words[0] in ("started", "copying") and words[1].isdigit():
        return int(words[1])
    return None


def stopped(pid: int | None) -> bool:
    """Whether process `pid` is stopped (by a signal, or under a tracer): it can give
    nothing up until it is continued. False where /proc cannot tell."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text("utf-8")
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()  # the name in (...) may hold spaces
    return bool(fields) and fields[0] in ("T", "t")


@contextmanager
def yielded(path: Path) -> Iterator[bool]:
    """When a copy holds the cache file `path`, ask it to give the file up and wait until
    it has exited (at most YIELD_WAIT_S, and not at all while it is stopped); yields
    whether it did. The request stands for the whole block, so no new copy starts
    meanwhile."""
    if not copying(path):
        yield False
        return
    fd = os.open(marker(path, "yield"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        deadline = time.monotonic() + YIELD_WAIT_S
        while copying(path):
            if time.monotonic() > deadline or stopped(copy_pid(path)):
                yield False
                return
            time.sleep(POLL_S)
        yield True
    finally:
        os.close(fd)


def wanted(path: Path) -> bool:
    return held(marker(path, "yield"), shared=True)


def say(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{text}\n".encode(), 0)
