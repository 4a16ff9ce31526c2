"""A first `evagg query` of a local lake answers from the task fragments read in place and
leaves their copy into its cache to a process of its own (dashboard/lake/fold_copy.py),
which gives the cache file up to a query that wants it; a copy interrupted or killed
leaves the cache as the command left it. What the user runs is the real command; what is
checked is what it printed and, through `evagg query sql`, what its cache holds.

The split lake's fragments are small enough to be copied inline: the tests lower
COPY_AFTER_EXIT_BYTES to 0 for the command run in process.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from dashboard.lake import fold_copy, fold_handover
from tests.commands import evagg, in_process
from tests.split_task_lake import write_merged_lake

FRAGMENTS = 4  # the split lake's: one per node-hour
HELD = ("SELECT (SELECT count(*) FROM fold.task_fold) AS stored, "
        "(SELECT count(*) FROM fold.placed) AS placed, "
        "(SELECT count(*) FROM fold_tasks) AS visible")
# The overview's timeline, and how many of its rows the cache keeps (the rest are counted
# from the compacted files read in place until the copy counts them).
TIMELINE = "SELECT * FROM event_timeline ORDER BY ALL"
KEPT = "SELECT count(*) AS kept FROM fold.timeline"
LIVENESS_S = 120.0  # a bound against a hang, not a speed: the copy takes a second
ROUNDS = 5  # tries to stop a copy while it holds the cache file


@pytest.fixture
def merged(tmp_path: Path) -> Path:
    return write_merged_lake(tmp_path / "lake")


@pytest.fixture
def detached(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, str]]:
    """Every copy is handed to a process; the (cache file, key) of each is recorded."""
    monkeypatch.setattr(fold_handover, "COPY_AFTER_EXIT_BYTES", 0)
    spawned: list[tuple[Path, str]] = []
    real = fold_handover.spawn

    def spawn(path: Path, key: str) -> bool:
        spawned.append((path, key))
        return real(path, key)

    monkeypatch.setattr(fold_handover, "spawn", spawn)
    return spawned


def query(capsys: pytest.CaptureFixture[str], lake: Path, cache: Path, *args: str) -> str:
    code, out, err = in_process(capsys, "--data", str(lake), "--cache", str(cache), *args)
    assert code == 0, err
    return out


def held(lake: Path, cache: Path) -> dict[str, int]:
    """What the cache holds, as `evagg query sql` shows it (a process of its own: it
    copies inline at its close, after answering)."""
    done = evagg("query", "sql", "--data", str(lake), "--cache", str(cache), "--json", HELD)
    assert done.returncode == 0, done.stderr
    found: dict[str, int] = json.loads(done.stdout)[0]
    return found


def wait_until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + LIVENESS_S
    while not check():
        assert time.monotonic() < deadline, "the copy never got there"
        time.sleep(0.01)


def settled(path: Path) -> str:
    """What the copy of `path` did, once it has exited."""
    wait_until(lambda: fold_handover.state(path).split(" ")[0] in ("copied", "yielded", "gave")
               and not fold_handover.copying(path))
    return fold_handover.state(path)


def cache_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.duckdb"))


def start_copy(path: Path, key: str) -> subprocess.Popen[bytes]:
    """The copy as the command starts it, but with its pid known to the test."""
    return subprocess.Popen([sys.executable, "-m", "dashboard.lake.fold_copy", str(path), key],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def test_a_first_query_answers_then_a_process_of_its_own_copies(
        capsys: pytest.CaptureFixture[str], merged: Path, tmp_path: Path,
        detached: list[tuple[Path, str]]) -> None:
    cache = tmp_path / "cache"
    scratch = query(capsys, merged, cache, "--no-cache", "summary")
    timeline = query(capsys, merged, cache, "--no-cache", "--json", "sql", TIMELINE)
    assert json.loads(query(capsys, merged, cache, "--no-cache", "--json", "sql", KEPT)
                      ) == [{"kept": 0}]  # a first open leaves the timeline to the copy
    first = query(capsys, merged, cache, "summary")
    assert first == scratch
    assert [p for p, _ in detached] == cache_files(cache)  # handed on, the file closed
    assert settled(cache_files(cache)[0]) == f"copied {FRAGMENTS}"
    assert not Path(f"{cache_files(cache)[0]}.wal").exists()  # checkpointed
    after = held(merged, cache)
    assert after["placed"] == 0 and after["stored"] == after["visible"]
    # the copy counted the timeline into the cache: the same rows, now kept
    assert query(capsys, merged, cache, "--json", "sql", TIMELINE) == timeline
    assert json.loads(query(capsys, merged, cache, "--json", "sql", KEPT)
                      ) == [{"kept": len(json.loads(timeline))}]
    # the next command answers the same from the table, and had nothing to hand on
    assert query(capsys, merged, cache, "summary") == first
    assert len(detached) == 1 and len(cache_files(cache)) == 1


def answered_with_copy_held_back(capsys: pytest.CaptureFixture[str], merged: Path,
                                 cache: Path, monkeypatch: pytest.MonkeyPatch,
                                 detached: list[tuple[Path, str]]) -> tuple[str, Path, str]:
    """A first query's answer, its copy recorded but not started: (answer, cache file, key)."""
    monkeypatch.setattr(fold_handover, "spawn", lambda path, key: detached.append((path, key))
                        or True)
    first = query(capsys, merged, cache, "summary")
    [(path, key)] = detached
    return first, path, key


# The copy as the command starts it, but slow: its statement runs, then its transaction
# stays open (a query at a time, each one a point where it can be interrupted) until a
# process that wants the file interrupts it, as a long copy would be.
SLOW_COPY = """
import sys, time
from dashboard.lake import fold_copy
from dashboard.lake.fold import TaskFold

def persist(self, cur):
    cur.execute("BEGIN TRANSACTION")
    cur.execute(self.sql["persist"])
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:
        cur.execute("SELECT count(*) FROM range(100000)")
    raise SystemExit("never asked for the file")

TaskFold.persist = persist
sys.exit(fold_copy.main(sys.argv[1:3]))
"""


def copy_holding_the_file(capsys: pytest.CaptureFixture[str], merged: Path, cache: Path,
                          detached: list[tuple[Path, str]], *, slow: bool = False
                          ) -> tuple[str, Path, subprocess.Popen[bytes]]:
    """A first query's answer, and its copy caught while it holds the cache file: stopped
    (SIGSTOP), or with `slow` running until a process wants the file. A copy too quick
    to be stopped is let finish and the round starts again with a new cache, so what
    follows always meets a copy that holds the file."""
    for attempt in range(ROUNDS):
        first = query(capsys, merged, cache / str(attempt), "summary")
        path, key = detached.pop()
        if slow:
            copy = subprocess.Popen([sys.executable, "-c", SLOW_COPY, str(path), key,
                                     str(LIVENESS_S)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        else:
            copy = start_copy(path, key)
        wait_until(lambda p=path, c=copy: fold_handover.state(p).startswith("copying")
                   or c.poll() is not None)
        if copy.poll() is None and slow:
            return first, path, copy
        if copy.poll() is None:
            os.kill(copy.pid, signal.SIGSTOP)
            if fold_handover.state(path).startswith("copying"):
                return first, path, copy
            os.kill(copy.pid, signal.SIGCONT)
        copy.wait(timeout=LIVENESS_S)
    raise AssertionError(f"every copy of {ROUNDS} finished before it could be stopped")


def test_a_query_while_the_copy_runs_takes_the_cache_from_it(
        capsys: pytest.CaptureFixture[str], merged: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, detached: list[tuple[Path, str]]) -> None:
    monkeypatch.setattr(fold_handover, "spawn", lambda path, key: detached.append((path, key))
                        or True)
    first, path, copy = copy_holding_the_file(capsys, merged, tmp_path / "cache", detached,
                                              slow=True)
    second = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "query", "--data", str(merged), "--cache",
         str(path.parent), "summary"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        # the second command asks for the file and waits for the copy to give it up
        wait_until(lambda: fold_handover.wanted(path) or second.poll() is not None)
        asked = fold_handover.wanted(path)
        out, err = second.communicate(timeout=LIVENESS_S)
    finally:
        for process in (second, copy):
            if process.poll() is None:
                process.kill()
    assert asked, f"the second command never asked the copy for the file: {err}"
    assert second.returncode == 0, err
    assert out == first
    copy.wait(timeout=LIVENESS_S)
    assert fold_handover.state(path) == "yielded"  # interrupted before any commit
    # one cache file: the second command did not fold the lake again beside it
    assert cache_files(path.parent) == [path]
    after = held(merged, path.parent)  # the second command copied at its close (inline)
    assert after["placed"] == 0 and after["stored"] == after["visible"]


def test_a_stopped_copy_does_not_hold_the_next_query_up(
        capsys: pytest.CaptureFixture[str], merged: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, detached: list[tuple[Path, str]]) -> None:
    """A copy the user suspended (^Z on a job that ran the first query, SIGSTOP) cannot
    give the file up: the next command answers at once from a cache file of its own,
    reading the fragments in place, instead of waiting YIELD_WAIT_S for it."""
    monkeypatch.setattr(fold_handover, "spawn", lambda path, key: detached.append((path, key))
                        or True)
    first, path, copy = copy_holding_the_file(capsys, merged, tmp_path / "cache", detached)
    try:
        started = time.monotonic()
        done = evagg("query", "--data", str(merged), "--cache", str(path.parent), "summary")
        took = time.monotonic() - started
    finally:
        os.kill(copy.pid, signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == first
    # a first query of this lake takes a second or two here: far from the 30 s it waited
    assert took < fold_handover.YIELD_WAIT_S / 3, f"the command waited {took:.1f} s"
    assert len(cache_files(path.parent)) == 2  # its own, beside the stopped copy's
    copy.wait(timeout=LIVENESS_S)  # continued, the copy ends as it would have
    assert fold_handover.state(path) in ("yielded", f"copied {FRAGMENTS}")


def test_a_copy_started_while_a_query_wants_the_cache_leaves_it_alone(
        capsys: pytest.CaptureFixture[str], merged: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, detached: list[tuple[Path, str]]) -> None:
    cache = tmp_path / "cache"
    first, path, key = answered_with_copy_held_back(capsys, merged, cache, monkeypatch,
                                                    detached)
    fold_handover.marker(path, "copy").touch()
    with fold_handover.yielded(path):  # no copy runs: it does not wait, and holds nothing
        pass
    # a process that wants the file (as fold_cache.attach_free does while it waits)
    with open(fold_handover.marker(path, "yield"), "w") as want:
        fcntl.flock(want, fcntl.LOCK_SH)
        assert fold_copy.copy(path, key) == "yielded"
    assert held(merged, cache)["placed"] == FRAGMENTS  # untouched; copied at that close
    assert held(merged, cache)["placed"] == 0
    assert query(capsys, merged, cache, "summary") == first


@pytest.mark.parametrize("when", ["at once", "copying"])
def test_a_killed_copy_leaves_a_cache_the_next_query_uses(
        when: str, capsys: pytest.CaptureFixture[str], merged: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, detached: list[tuple[Path, str]]) -> None:
    cache = tmp_path / "cache"
    first, path, key = answered_with_copy_held_back(capsys, merged, cache, monkeypatch,
                                                    detached)
    with duckdb.connect(str(path), read_only=True) as con:
        generation = con.execute("SELECT value FROM meta WHERE key = 'generation'").fetchall()
    copy = start_copy(path, key)
    if when == "copying":
        wait_until(lambda: fold_handover.state(path).startswith("copying")
                   or copy.poll() is not None)
    copy.kill()
    copy.wait(timeout=LIVENESS_S)
    # the next command opens the same file (not a new one beside it, not rebuilt): the
    # rows the copy did not commit are still read in place, the answers the same
    assert query(capsys, merged, cache, "summary") == first
    seen = held(merged, cache)  # copied at the close of the query before, or of this one
    assert seen["placed"] in (0, FRAGMENTS)
    after = held(merged, cache)
    assert after == {"stored": seen["visible"], "placed": 0, "visible": seen["visible"]}
    assert cache_files(cache) == [path]
    rows = json.loads(evagg("query", "sql", "--data", str(merged), "--cache", str(cache),
                            "--json", "SELECT value FROM fold.meta WHERE key = 'generation'"
                            ).stdout)
    assert [[r["value"]] for r in rows] == [list(g) for g in generation]
