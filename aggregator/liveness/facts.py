"""What a stored batch says about attempts that start and end: a few columns of the
rows that matter, picked with Arrow compute in the worker thread that builds the
spool record, so the event loop only applies short tuples.

Rows that matter: `task` rows with a state (Ray's and emitters'), `op` rows with a
span_id, and Ray's `job` and `actor` rows. Everything else (heartbeats, spans, metrics
events) is dropped by one vectorised filter before anything becomes a Python object.
A task's or op's end needs only its key: most rows of a busy producer are ends (a
training loop's ops are each one FINISHED event), so they come out as bare keys, which
cost a tenth of a whole `Fact` here and on the loop.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

WATCHED_KINDS = ("task", "op", "job", "actor")
ATTEMPT_KINDS = ("task", "op")
TERMINAL = frozenset({"FINISHED", "FAILED"})  # the states that end a task or op attempt
INFERRED = "evagg_inferred"  # the attrs key that marks an end evagg inferred

# An attempt's key: kind, session, id and attempt in one string (attempt_key). A string,
# not a tuple, because a busy producer's batch ends a thousand attempts: Arrow joins
# their keys in one call, where tuples cost twice as much to build in Python.
Key = str
KEY_SEPARATOR = "\x1f"  # ASCII's unit separator: in no id a producer sends on purpose
NO_ENDS: frozenset[Key] = frozenset()


def attempt_key(kind: str, session: str, key_id: str, attempt: int) -> Key:
    return KEY_SEPARATOR.join((kind, session, key_id, str(attempt)))


@functools.cache
def _strings(values: tuple[str, ...]) -> pa.Array:
    """Made on first use, not at import: pyarrow converting Python objects imports pandas,
    which the agent keeps out only once it has started (aggregator/memory.py)."""
    return pa.array(values, type=pa.string())


class Fact(NamedTuple):
    kind: str
    state: str
    source: str
    session: str  # attrs ray_session; "" for emitters
    key_id: str  # task_id (or event_id without one), span_id, job_id or actor_id
    attempt: int
    job_id: str | None
    run_id: str | None
    node_id: str | None
    worker_id: str | None
    name: str | None
    step: int | None
    task_id: str | None  # an op's task
    pid: int | None  # the producer's, stamped by the agent from the socket's credentials
    worker_pid: int | None  # Ray's worker (or driver) pid from attrs
    time_ns: int
    inferred: bool


class BatchFacts(NamedTuple):
    """What one batch says: its facts in row order, then the keys of the task and op
    attempts it ends, producers' and Ray's apart. Applying the ends after the facts gives
    what row order gives: an end closes its key, whichever came first
    (aggregator/liveness/openset.py)."""

    facts: list[Fact]
    ends: frozenset[Key]
    ray_ends: frozenset[Key]  # Ray's events of one attempt come in any order: each is kept


def facts_of(batch: pa.RecordBatch, ops_open: bool = True) -> BatchFacts:
    """The facts and ends of one batch; both empty for a batch with neither.

    `ops_open` False says no op is open: then a batch of producers' op ends (a training
    loop's, the commonest batch) can close nothing, and its keys are not made at all.
    Remembering them would only stop a start another process sends after the end from
    opening (a producer's own start comes first on its one connection); such a start is
    watched, and the end inferred if that process dies ranks below the real one."""
    if batch.num_rows == 0:
        return BatchFacts([], NO_ENDS, NO_ENDS)
    if _only_producer_op_ends(batch):
        return BatchFacts([], _op_ends(batch) if ops_open else NO_ENDS, NO_ENDS)
    return general_facts_of(batch)


def general_facts_of(batch: pa.RecordBatch) -> BatchFacts:
    """facts_of for any batch, the careful twin its short path is held to."""
    kind, state = batch.column("kind"), batch.column("state")
    watched = pc.and_(pc.is_in(kind, value_set=_strings(WATCHED_KINDS)), pc.is_valid(state))
    ending = pc.and_(pc.and_(watched, pc.is_in(kind, value_set=_strings(ATTEMPT_KINDS))),
                     pc.is_in(state, value_set=_strings(tuple(sorted(TERMINAL)))))
    # A task's definition opens nothing its lifecycle rows do not (a fifth of Ray's rows).
    defined = pc.and_(pc.equal(kind, "task"), pc.equal(state, "DEFINED"))
    opening = pc.and_(watched, pc.invert(pc.or_(ending, defined)))
    if not pc.any(ending).as_py():
        return BatchFacts(_facts(batch, opening), NO_ENDS, NO_ENDS)
    ray = pc.fill_null(pc.equal(batch.column("source"), "ray"), False)
    columns = _key_columns(batch)
    keys = _joined_keys(columns)
    # A start whose attempt ends in this same batch changes nothing (Ray's executor
    # RUNNING beside the owner's FINISHED): not made a Fact at all.
    if pc.any(opening).as_py():
        ended = pc.fill_null(pc.is_in(keys, value_set=keys.filter(ending)), False)
        opening = pc.and_(opening, pc.invert(ended))
    with_id = pc.not_equal(columns[2], "")
    return BatchFacts(_facts(batch, opening),
                      _ends(keys, pc.and_(pc.and_(ending, with_id), pc.invert(ray))),
                      _ends(keys, pc.and_(pc.and_(ending, with_id), ray)))


def _only_producer_op_ends(batch: pa.RecordBatch) -> bool:
    """Whether every row is the end of an op, from a producer rather than Ray: a
    training loop's batch, the commonest of all. Three calls tell, where the general
    path makes some twenty; one state throughout, or the general path decides."""
    kind, state = batch.column("kind"), batch.column("state")
    if kind.null_count or state.null_count:
        return False
    kinds, states = pc.min_max(kind), pc.min_max(state)
    if kinds["min"].as_py() != "op" or kinds["max"].as_py() != "op":
        return False
    if states["min"].as_py() != states["max"].as_py() or states["min"].as_py() not in TERMINAL:
        return False
    return pc.any(pc.equal(batch.column("source"), "ray")).as_py() is not True


def _op_ends(batch: pa.RecordBatch) -> frozenset[Key]:
    """The keys of a batch of op ends (_only_producer_op_ends), those with a span_id."""
    span_ids = pc.fill_null(batch.column("span_id"), "")
    keys = _joined_keys([batch.column("kind"),
                         pc.fill_null(_attr(batch.column("attrs"), "ray_session"), ""),
                         span_ids, pc.fill_null(batch.column("attempt"), 0)])
    return _ends(keys, pc.not_equal(span_ids, ""))


def _key_columns(batch: pa.RecordBatch) -> list[pa.Array]:
    """An attempt's key of every row: four columns, since filtering the whole batch
    would cost more than the rest."""
    kind = batch.column("kind")
    return [kind, pc.fill_null(_attr(batch.column("attrs"), "ray_session"), ""),
            _key_ids(batch, kind), pc.fill_null(batch.column("attempt"), 0)]


def _joined_keys(columns: list[pa.Array]) -> pa.Array:
    """attempt_key of every row, joined by Arrow (the same text, attempt as digits)."""
    return pc.binary_join_element_wise(*columns[:3], pc.cast(columns[3], pa.string()),
                                       KEY_SEPARATOR)


def _ends(keys: pa.Array, mask: pa.Array) -> frozenset[Key]:
    """The keys of the rows of `mask`, made a set here in the decode thread, not on the
    loop (aggregator/liveness/end_memory.py keeps them as they are)."""
    if not pc.any(mask).as_py():
        return NO_ENDS
    return frozenset(keys.filter(mask).to_pylist())


def _facts(batch: pa.RecordBatch, mask: pa.Array) -> list[Fact]:
    if not pc.any(mask).as_py():
        return []
    rows = batch.filter(mask)
    attrs = rows.column("attrs")
    kind = rows.column("kind")
    columns = [
        kind, rows.column("state"), pc.fill_null(rows.column("source"), ""),
        pc.fill_null(_attr(attrs, "ray_session"), ""), _key_ids(rows, kind),
        pc.fill_null(rows.column("attempt"), 0), rows.column("job_id"), rows.column("run_id"),
        rows.column("node_id"), rows.column("worker_id"), rows.column("name"),
        rows.column("step"), rows.column("task_id"), rows.column("pid"),
        _pids(pc.coalesce(_attr(attrs, "worker_pid"), _attr(attrs, "ray_driver_pid"))),
        pc.fill_null(pc.cast(rows.column("time"), pa.int64()), 0),
        pc.is_valid(_attr(attrs, INFERRED)),
    ]
    return list(map(Fact._make, zip(*(column.to_pylist() for column in columns),
                                    strict=True)))


def _key_ids(rows: pa.RecordBatch, kind: pa.Array) -> pa.Array:
    """What the readers key the row on (dashboard/sql/tasks.sql, ops.sql, raystate): a
    task's task_id (its event_id without one), an op's span_id, a job's or actor's id."""
    kinds = kind.unique()
    if len(kinds) == 1 and kinds[0].as_py() == "op":  # a training loop's batch: one call
        return pc.fill_null(rows.column("span_id"), "")
    task = pc.coalesce(_nonempty(rows.column("task_id")), rows.column("event_id"))
    other = pc.if_else(pc.equal(kind, "op"), rows.column("span_id"),
                       pc.if_else(pc.equal(kind, "job"), rows.column("job_id"),
                                  rows.column("actor_id")))
    return pc.fill_null(pc.if_else(pc.equal(kind, "task"), task, _nonempty(other)), "")


def _nonempty(column: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)


def _attr(attrs: pa.Array, key: str) -> pa.Array:
    return pc.map_lookup(attrs, key, "first")


def _pids(text: pa.Array) -> pa.Array:
    """Positive pids from their text; anything else is null."""
    digits = pc.and_(pc.utf8_is_digit(text), pc.less_equal(pc.utf8_length(text), 9))
    numbers = pc.cast(pc.if_else(digits, text, pa.scalar(None, pa.string())), pa.int64())
    return pc.if_else(pc.greater(numbers, 0), numbers, pa.scalar(None, pa.int64()))
