"""Which events of a body read by `json_columns` the columnar path takes, and their
values converted: whole columns at a time, with pyarrow and numpy.

An event is taken only when this path is sure to give the rows the fast path gives:
exactly the fields Ray sends today and no null (`exact`: the event's minified text is
as long as its fields), a task definition or lifecycle event in camelCase, ids in
base64, times in Ray's own UTC shape with valid fields from 1970 to 2261, attempts and
pids as JSON integers, strings where Ray sends strings, 1 to 64 transitions, and no
error info. Whatever else (an id of another form, a time with an offset, a failed
task's error) leaves the event to the Python path, which gives the same rows or names
the reason it cannot.
"""

from __future__ import annotations

import itertools
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from aggregator.ray.json_columns import (
    DEFINITION,
    DEFINITIONS,
    ENVELOPE,
    LIFECYCLE,
    LIFECYCLE_EVENT,
    LIFECYCLE_KEY,
)

B64: Final = r'^"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"$'
# Ray's shape with valid fields only, where Arrow's cast and the careful parser agree
# (DuckDB's would take 24:00:00), from 1970 to 2261 (int64 nanoseconds end in 2262).
TIME: Final = (r'^"(?:19[7-9]\d|2[01]\d\d|22[0-5]\d|226[01])-(?:0[1-9]|1[0-2])-'
                r'(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?Z"$')
INT: Final = r"^-?\d{1,10}$"
PID: Final = r"^-?[1-9]\d{0,18}$"  # 0 (and -0) is no pid: the fast path sets none
_STEPS_MAX: Final = 64


def field(array: pa.Array, *path: str) -> pa.Array:
    """A struct's child by path, null where any parent is null."""
    for name in path:
        array = pc.struct_field(array, name)
    return array


def mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def valid_of(array: pa.Array) -> np.ndarray:
    """Where an array is set, from its validity bitmap (its own, not its parents')."""
    validity = array.buffers()[0]
    if validity is None:
        return np.ones(len(array), dtype=bool)
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    return bits[array.offset:array.offset + len(array)].astype(bool)


def list_lengths(lists: pa.Array) -> np.ndarray:
    return np.asarray(pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False),
                      dtype=np.int64)


class Leaf:
    """A column of JSON texts seen through numpy, with no call per check: which are set,
    their lengths and their first bytes (what a JSON text is: '"' a string, '{' an
    object; a string of length 2 is empty)."""

    __slots__ = ("array", "first", "length", "valid")
    valid: npt.NDArray[np.bool_]
    length: npt.NDArray[np.int64]
    first: npt.NDArray[np.uint8]

    def __init__(self, array: pa.Array, parent: np.ndarray | None = None) -> None:
        """`parent`: where the struct holding this field is set (a child's own validity
        does not say)."""
        count, start = len(array), array.offset
        _, offsets, data = array.buffers()
        ends = np.frombuffer(offsets, dtype=np.int32)[start:start + count + 1]
        self.valid = valid_of(array) if parent is None else valid_of(array) & parent
        self.array = array  # set under an unset parent: `valid` says which count
        self.length = np.where(self.valid, np.diff(ends), 0).astype(np.int64)
        chars = np.frombuffer(data, dtype=np.uint8) if data is not None and data.size \
            else np.zeros(1, dtype=np.uint8)
        self.first = np.where(self.length > 0, chars[np.minimum(ends[:-1], chars.size - 1)], 0)

    def text_or_absent(self) -> np.ndarray:
        found: np.ndarray = ~self.valid | (self.first == ord('"'))
        return found

    def empty_text(self) -> np.ndarray:
        found: np.ndarray = (self.length == 2) & (self.first == ord('"'))
        return found


def matching(leaves: list[Leaf], pattern: str) -> list[np.ndarray]:
    """Which texts of each leaf match: one regex pass over all of them."""
    found = mask(pc.match_substring_regex(
        pa.concat_arrays([leaf.array for leaf in leaves]), pattern))
    bounds = np.cumsum([0] + [len(leaf.valid) for leaf in leaves])
    return [found[a:b] for a, b in itertools.pairwise(bounds)]


def _object_size(leaves: dict[str, Leaf], steps: np.ndarray | None,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The minified length of each object if it holds only these fields, none of them
    null (braces, then per field its quoted name, a colon, its text and a comma, less
    one); and how many it holds."""
    count = len(next(iter(leaves.values())).valid)
    total = np.ones(count, dtype=np.int64)
    present = np.zeros(count, dtype=np.int64)
    for name, leaf in leaves.items():
        total += np.where(leaf.valid, len(name) + 4 + leaf.length, 0)
        present += leaf.valid
    if steps is not None:
        total += np.where(steps >= 0, len("stateTransitions") + 4 + steps, 0)
        present += steps >= 0
    return total + (present == 0), present


class Body:
    """The leaves of every event of a body read by `json_columns`."""

    def __init__(self, table: pa.Table) -> None:
        self.event = table.column("event").combine_chunks()
        self.size = table.column("size").to_numpy()
        self.valid = valid_of(self.event)
        self.envelope = {n: Leaf(self.event.field(n), self.valid) for n in ENVELOPE}
        self.present = {key: valid_of(self.event.field(key)) & self.valid
                        for key in (*DEFINITIONS.values(), LIFECYCLE_KEY)}
        life, life_set = self.event.field(LIFECYCLE_KEY), self.present[LIFECYCLE_KEY]
        self.life = {n: Leaf(life.field(n), life_set)
                     for n in LIFECYCLE if n != "stateTransitions"}
        self.steps = field(self.event, LIFECYCLE_KEY, "stateTransitions")
        flat = self.steps.flatten()
        self.states, self.step_times = Leaf(flat.field("state")), Leaf(flat.field("timestamp"))
        self.step_parents = np.asarray(pc.list_parent_indices(self.steps))
        self.definitions = {key: {n: Leaf(self.event.field(key).field(n), self.present[key])
                                  for n in DEFINITION} for key in DEFINITIONS.values()}

    def exact(self) -> np.ndarray:
        """Events whose text holds only today's fields, none of them null."""
        total = np.ones(len(self.size), dtype=np.int64)
        fields = np.zeros(len(self.size), dtype=np.int64)
        for name, leaf in self.envelope.items():
            total += np.where(leaf.valid, len(name) + 4 + leaf.length, 0)
            fields += leaf.valid
        each = 24 + self.states.length + self.step_times.length
        steps = 1 + np.bincount(self.step_parents, weights=each, minlength=len(total)) \
            .astype(np.int64) + (list_lengths(self.steps) == 0)
        steps = np.where(mask(self.steps.is_valid()), steps, -1)
        payloads = {LIFECYCLE_KEY: _object_size(self.life, steps)}
        payloads.update({k: _object_size(v, None) for k, v in self.definitions.items()})
        hollow = np.zeros(len(total), dtype=bool)  # "" and [] read as an empty object
        for key, (size, held) in payloads.items():
            total += np.where(self.present[key], len(key) + 4 + size, 0)
            fields += self.present[key]
            hollow |= self.present[key] & (held == 0)
        found: np.ndarray = self.valid & ~hollow & (self.size == total + (fields == 0))
        return found

    def kinds(self) -> tuple[np.ndarray, np.ndarray]:
        """(a lifecycle event, a definition event), each holding its own payload only."""
        kind = self.envelope["eventType"].array
        only = np.sum([p.astype(np.int64) for p in self.present.values()], axis=0) == 1
        life = mask(pc.equal(kind, f'"{LIFECYCLE_EVENT}"')) & self.present[LIFECYCLE_KEY]
        definition = np.zeros(len(only), dtype=bool)
        for name, key in DEFINITIONS.items():
            definition |= mask(pc.equal(kind, f'"{name}"')) & self.present[key]
        return life & only, definition & only


def sure(body: Body) -> np.ndarray:
    """The events of a shape the columnar path is sure of (see the module's doc)."""
    life, definition = body.kinds()
    envelope = body.envelope
    payload = _definition_leaves(body)
    ids = [envelope["eventId"], envelope["nodeId"], *(body.life[n] for n in _LIFE_IDS),
           *(payload[n] for n in _DEFINITION_IDS)]
    ids_ok = [m | ~leaf.valid for m, leaf in zip(matching(ids, B64), ids, strict=True)]
    event_id_ok = ids_ok[0] & envelope["eventId"].valid & ~envelope["eventId"].empty_text()
    stamp = envelope["timestamp"]
    stamp_ok, step_times_ok = matching([stamp, body.step_times], TIME)
    ok = body.exact() & (life | definition) & event_id_ok & ids_ok[1]
    ok &= stamp_ok | ~stamp.valid | stamp.empty_text()
    for name in ("sourceType", "message", "severity", "sessionName"):
        ok &= envelope[name].text_or_absent()
    life_ok = np.logical_and.reduce(ids_ok[2:2 + len(_LIFE_IDS)]) & _life_ok(body, step_times_ok)
    definition_ok = np.logical_and.reduce(ids_ok[2 + len(_LIFE_IDS):])
    for name in ("taskName", "actorTaskName", "serializedRuntimeEnv"):
        definition_ok &= payload[name].text_or_absent()
    life_ok &= _int32_ok(body.life["taskAttempt"])
    definition_ok &= _int32_ok(payload["taskAttempt"])
    taken: np.ndarray = ok & np.where(life, life_ok, definition_ok)
    return taken


_LIFE_IDS: Final = ("taskId", "jobId", "nodeId", "workerId")
_DEFINITION_IDS: Final = ("taskId", "jobId", "parentTaskId", "actorId", "placementGroupId")


def _definition_leaves(body: Body) -> dict[str, Leaf]:
    """The definition payload's leaves, of whichever definition type the event is."""
    task, actor = (body.definitions[k] for k in DEFINITIONS.values())
    return {n: Leaf(pc.coalesce(task[n].array, actor[n].array)) for n in DEFINITION}


def _life_ok(body: Body, step_times_ok: np.ndarray) -> np.ndarray:
    """pid, error info and transitions as the fast path takes them, without an error."""
    pid, error = body.life["workerPid"], body.life["rayErrorInfo"]
    pid_ok = ~pid.valid | ((pid.length == 1) & (pid.first == ord("0")))
    pid_ok |= matching([pid], PID)[0]
    states = body.states
    good = (states.first == ord('"')) & ~states.empty_text() & step_times_ok
    good &= ~mask(pc.match_substring(states.array, "\\"))  # an escape: not what it reads as
    bad = np.bincount(body.step_parents[~good], minlength=len(pid.valid))
    counts = list_lengths(body.steps)
    no_error = ~error.valid | ((error.length == 2) & (error.first == ord("{")))
    ok: np.ndarray = pid_ok & no_error & (bad == 0) & (counts >= 1) & (counts <= _STEPS_MAX)
    return ok


def _int32_ok(leaf: Leaf) -> np.ndarray:
    """Absent (0), or a JSON integer in int32's range."""
    digits = matching([leaf], INT)[0]
    numbers = pc.if_else(pa.array(digits), leaf.array, pa.scalar(None, pa.string()))
    wide = numbers.cast(pa.int64()).fill_null(0)
    in_range = mask(pc.and_(pc.greater_equal(wide, -2**31), pc.less(wide, 2**31)))
    ok: np.ndarray = ~leaf.valid | (digits & in_range)
    return ok
