"""The open set fed a batch at a time (its facts, then its ends as bare keys) holds the
same attempts as the open set fed the same rows one by one, in row order: the ends'
short path is held to the careful one, over Hypothesis's mixes of starts, ends, late
starts, repeats, Ray's and producers' rows and rows with no key."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.decode.columns import decode_columns
from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.liveness import restart
from aggregator.liveness.facts import (
    _only_producer_op_ends,
    attempt_key,
    facts_of,
    general_facts_of,
)
from aggregator.liveness.openset import MAX_LONE_ENDS, OpenSet
from emitters.columns import encode_rows
from emitters.ids import new_event_id


@pytest.fixture(scope="module")
def worker_pid() -> Iterator[int]:
    """A live local process, so that the producers' and Ray's starts are tracked."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    time.sleep(0.2)  # started well before the rows' times
    yield process.pid
    process.kill()
    process.wait()


KEYS = st.sampled_from(["a", "b", "c", ""])
ROW = st.fixed_dictionaries({
    "kind": st.sampled_from(["task", "op"]),
    "state": st.sampled_from(["PENDING", "RUNNING", "STARTED", "FINISHED", "FAILED", "DEFINED"]),
    "key": KEYS,
    "attempt": st.integers(0, 1),
    "ray": st.booleans(),
})


def event(row: dict[str, Any], n: int, pid: int) -> dict[str, Any]:
    now = time.time_ns() + n
    out: dict[str, Any] = {"kind": row["kind"], "state": row["state"], "attempt": row["attempt"],
                           "name": "work", "time": now, "event_id": new_event_id(now)}
    out["span_id" if row["kind"] == "op" else "task_id"] = row["key"]
    if row["ray"]:
        out["source"] = "ray"
        out["attrs"] = {"ray_session": "session_1", "worker_pid": str(pid)}
    return out


def attempts_of(open_set: OpenSet) -> dict[Any, tuple[Any, ...]]:
    return {key: (a.state, a.pid, a.name) for key, a in open_set.attempts.items()}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(ROW, min_size=1, max_size=12), min_size=1, max_size=5))
def test_a_batch_at_a_time_opens_and_closes_what_its_rows_one_by_one_do(
        batches: list[list[dict[str, Any]]], worker_pid: int) -> None:
    stamp = Stamp(time.time_ns(), worker_pid, 0, "node", "host")
    by_batch, by_row = OpenSet(), OpenSet()
    for batch_rows in batches:
        events = [event(row, n, worker_pid) for n, row in enumerate(batch_rows)]
        by_batch.apply(facts_of(rows_to_batch(events, stamp).batch))
        for one in events:
            by_row.apply(facts_of(rows_to_batch([one], stamp).batch))
        assert attempts_of(by_batch) == attempts_of(by_row)
    # an end is remembered as closing an open attempt or as a lone end; a late start
    # opens nothing either way
    assert ({*by_batch.closed, *by_batch.lone_ends} == {*by_row.closed, *by_row.lone_ends})


def in_order(batches: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The batches less every start of a key after that key's end: what one producer's
    connection carries (its own start comes before its end)."""
    ended: set[tuple[Any, ...]] = set()
    out = []
    for rows in batches:
        kept = []
        for row in rows:
            key = (row["kind"], row["key"], row["attempt"], row["ray"])
            if row["state"] in ("FINISHED", "FAILED"):
                ended.add(key)
            elif key in ended:
                continue
            kept.append(row)
        out.append(kept or rows[:0])
    return [rows for rows in out if rows]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(ROW, min_size=1, max_size=12), min_size=1, max_size=6))
def test_ends_that_can_close_no_open_op_are_skipped_without_changing_what_is_open(
        batches: list[list[dict[str, Any]]], worker_pid: int) -> None:
    """The agent makes no keys for a batch of op ends while no op is open (the watcher's
    `ops_open`): over one producer's ordered rows, the open set is what the careful path
    gives, and `open_ops` counts its open ops throughout."""
    stamp = Stamp(time.time_ns(), worker_pid, 0, "node", "host")
    gated, careful = OpenSet(), OpenSet()
    for batch_rows in in_order(batches):
        events = [event(row, n, worker_pid) for n, row in enumerate(batch_rows)]
        batch = rows_to_batch(events, stamp).batch
        gated.apply(facts_of(batch, ops_open=gated.open_ops > 0))
        careful.apply(facts_of(batch))
        assert attempts_of(gated) == attempts_of(careful)
        assert gated.open_ops == sum(a.kind == "op" for a in gated.attempts.values())


def test_open_ops_counts_what_a_process_exit_and_a_restart_leave(
        worker_pid: int, tmp_path: Path) -> None:
    stamp = Stamp(time.time_ns(), worker_pid, 0, "node", "host")
    open_set = OpenSet()
    starts = [event({"kind": kind, "state": state, "key": f"k{n}", "attempt": 0,
                     "ray": False}, n, worker_pid)
              for n, (kind, state) in enumerate([("op", "STARTED"), ("op", "STARTED"),
                                                 ("task", "RUNNING")])]
    open_set.apply(facts_of(rows_to_batch(starts, stamp).batch))
    assert (open_set.open_ops, len(open_set.attempts)) == (2, 3)
    restart.save(restart.parts_of(open_set), tmp_path)
    restored = OpenSet()
    restart.load(restored, tmp_path)
    assert (restored.open_ops, len(restored.attempts)) == (2, 3)
    open_set.take_attempts({worker_pid})  # the process exited: its attempts end
    assert (open_set.open_ops, open_set.attempts) == (0, {})
    # with none open, a training loop's ends make no keys; one open again, they do
    ends = rows_to_batch([event({"kind": "op", "state": "FINISHED", "key": f"e{n}",
                                 "attempt": 0, "ray": False}, n, worker_pid)
                          for n in range(3)], stamp).batch
    assert facts_of(ends, ops_open=restored.open_ops > 0).ends
    assert not facts_of(ends, ops_open=open_set.open_ops > 0).ends


def test_a_batch_of_lone_ends_opens_nothing_and_closes_an_open_op(worker_pid: int) -> None:
    stamp = Stamp(time.time_ns(), worker_pid, 0, "node", "host")
    open_set = OpenSet()
    open_set.apply(facts_of(rows_to_batch([event(
        {"kind": "op", "state": "STARTED", "key": "open", "attempt": 0, "ray": False},
        0, worker_pid)], stamp).batch))
    assert list(open_set.attempts) == [attempt_key("op", "", "open", 0)]
    ends = [event({"kind": "op", "state": "FINISHED", "key": f"s{n}", "attempt": 0,
                   "ray": False}, n, worker_pid) for n in range(1000)]
    ends.append(event({"kind": "op", "state": "FINISHED", "key": "open", "attempt": 0,
                       "ray": False}, 1000, worker_pid))
    found = facts_of(rows_to_batch(ends, stamp).batch)
    assert found.facts == [] and len(found.ends) == 1001
    open_set.apply(found)
    assert open_set.attempts == {}
    # a late start of an ended op opens nothing
    open_set.apply(facts_of(rows_to_batch([event(
        {"kind": "op", "state": "STARTED", "key": "s7", "attempt": 0, "ray": False},
        0, worker_pid)], stamp).batch))
    assert open_set.attempts == {}


def test_rays_end_outlasts_any_number_of_producer_ends(worker_pid: int) -> None:
    """Ray's executor RUNNING may come after the owner's FINISHED: that end is kept
    however many producers' lone ends follow it."""
    stamp = Stamp(time.time_ns(), worker_pid, 0, "node", "host")
    open_set = OpenSet()
    ray_end = event({"kind": "task", "state": "FINISHED", "key": "r", "attempt": 0,
                     "ray": True}, 0, worker_pid)
    lone = [event({"kind": "op", "state": "FINISHED", "key": f"s{n}", "attempt": 0,
                   "ray": False}, n, worker_pid) for n in range(MAX_LONE_ENDS + 1)]
    open_set.apply(facts_of(rows_to_batch([ray_end, *lone], stamp).batch))
    late = event({"kind": "task", "state": "RUNNING", "key": "r", "attempt": 0, "ray": True},
                 0, worker_pid)
    open_set.apply(facts_of(rows_to_batch([late], stamp).batch))
    assert open_set.attempts == {}
    assert MAX_LONE_ENDS <= len(open_set.lone_ends) < 2 * MAX_LONE_ENDS


OP_END = st.fixed_dictionaries({
    "state": st.sampled_from(["FINISHED", "FAILED", "RUNNING"]),
    "span_id": st.sampled_from(["s1", "s2", "", None]),
    "attempt": st.sampled_from([0, 1, None]),
    "session": st.sampled_from([None, "session_1"]),
    "source": st.sampled_from(["torch", "ray", None]),
})


def op_event(row: dict[str, Any], n: int) -> dict[str, Any]:
    now = time.time_ns() + n
    out: dict[str, Any] = {"kind": "op", "state": row["state"], "name": "forward", "time": now,
                           "event_id": new_event_id(now)}
    for field in ("span_id", "attempt", "source"):
        if row[field] is not None:
            out[field] = row[field]
    if row["session"]:
        out["attrs"] = {"ray_session": row["session"]}
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(OP_END, min_size=1, max_size=8), as_columns=st.booleans())
def test_a_batch_of_op_ends_gives_what_the_general_path_gives(
        rows: list[dict[str, Any]], as_columns: bool) -> None:
    """A training loop's batch takes a short path (facts_of); the careful one decides
    every batch it is not sure of, and both agree on every batch of ops."""
    events = [op_event(row, n) for n, row in enumerate(rows)]
    stamp = Stamp(time.time_ns(), 1, 0, "node", "host")
    if as_columns:
        batch = decode_columns(encode_rows(events, {}), len(events), stamp).batch
    else:
        batch = rows_to_batch(events, stamp).batch
    assert facts_of(batch) == general_facts_of(batch)


def test_the_short_path_is_taken_for_a_training_loops_batch() -> None:
    events = [op_event({"state": "FINISHED", "span_id": f"s{n}", "attempt": None,
                        "session": None, "source": "torch"}, n) for n in range(3)]
    batch = rows_to_batch(events, Stamp(time.time_ns(), 1, 0, "node", "host")).batch
    assert _only_producer_op_ends(batch)
    assert facts_of(batch).ends == {attempt_key("op", "", f"s{n}", 0) for n in range(3)}
