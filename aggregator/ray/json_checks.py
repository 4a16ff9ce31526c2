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
from typing import Any, Final

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
from aggregator.ray.values import RayValueError, b64_hex

B64: Final = r'^"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"$'
# Ray's shape with valid fields only, where Arrow's cast and the careful parser agree
# (DuckDB's would take 24:00:00), from 1970 to 2261 (int64 nanoseconds end in 2262).
TIME: Final = (r'^"(?:19[7-9]\d|2[01]\d\d|22[0-5]\d|226[01])-(?:0[1-9]|1[0-2])-'
                r'(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?Z"$')
_INT: Final = r"^-?\d{1,10}$"
PID: Final = r"^-?[1-9]\d{0,18}$"  # 0 (and -0) is no pid: the fast path sets none
_STEPS_MAX: Final = 64
_UTC_NS: Final = pa.timestamp("ns", tz="UTC")


def field(array: pa.Array, *path: str) -> pa.Array:
    """A struct's child by path, null where any parent is null."""
    for name in path:
        array = pc.struct_field(array, name)
    return array


def mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


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

    def __init__(self, array: pa.Array) -> None:
        count, start = len(array), array.offset
        validity, offsets, data = array.buffers()
        ends = np.frombuffer(offsets, dtype=np.int32)[start:start + count + 1]
        self.array = array
        self.valid = np.ones(count, dtype=bool) if validity is None else np.unpackbits(
            np.frombuffer(validity, dtype=np.uint8), bitorder="little")[start:start + count] \
            .astype(bool)
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


def _matching(leaves: list[Leaf], pattern: str) -> list[np.ndarray]:
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
        self.valid = mask(self.event.is_valid())
        self.envelope = {n: Leaf(field(self.event, n)) for n in ENVELOPE}
        life = field(self.event, LIFECYCLE_KEY)
        self.life = {n: Leaf(field(life, n)) for n in LIFECYCLE if n != "stateTransitions"}
        self.steps = field(life, "stateTransitions")
        flat = self.steps.flatten()
        self.states, self.step_times = Leaf(flat.field("state")), Leaf(flat.field("timestamp"))
        self.step_parents = np.asarray(pc.list_parent_indices(self.steps))
        self.definitions = {key: {n: Leaf(field(self.event, key, n)) for n in DEFINITION}
                            for key in DEFINITIONS.values()}
        self.present = {key: mask(field(self.event, key).is_valid())
                        for key in (*DEFINITIONS.values(), LIFECYCLE_KEY)}

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
    ids_ok = [m | ~leaf.valid for m, leaf in zip(_matching(ids, B64), ids, strict=True)]
    event_id_ok = ids_ok[0] & envelope["eventId"].valid & ~envelope["eventId"].empty_text()
    stamp = envelope["timestamp"]
    stamp_ok, step_times_ok = _matching([stamp, body.step_times], TIME)
    ok = body.exact() & (life | definition) & event_id_ok & ids_ok[1]
    ok &= stamp_ok | ~stamp.valid | stamp.empty_text()
    for name in ("sourceType", "message", "severity", "sessionName"):
        ok &= envelope[name].text_or_absent()
    life_ok = np.logical_and.reduce(ids_ok[2:2 + len(_LIFE_IDS)]) & _life_ok(body, step_times_ok)
    definition_ok = np.logical_and.reduce(ids_ok[2 + len(_LIFE_IDS):])
    for name in ("taskName", "actorTaskName", "serializedRuntimeEnv"):
        definition_ok &= payload[name].text_or_absent()
    life_ok &= int32s(body.life["taskAttempt"].array)[1]
    definition_ok &= int32s(payload["taskAttempt"].array)[1]
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
    pid_ok |= _matching([pid], PID)[0]
    states = body.states
    good = (states.first == ord('"')) & ~states.empty_text() & step_times_ok
    good &= ~mask(pc.match_substring(states.array, "\\"))  # an escape: not what it reads as
    bad = np.bincount(body.step_parents[~good], minlength=len(pid.valid))
    counts = list_lengths(body.steps)
    no_error = ~error.valid | ((error.length == 2) & (error.first == ord("{")))
    ok: np.ndarray = pid_ok & no_error & (bad == 0) & (counts >= 1) & (counts <= _STEPS_MAX)
    return ok


def hex_ids(values: pa.Array, cache: bool = True) -> tuple[pa.Array, np.ndarray]:
    """Quoted base64 ids (already matched) -> hex, null for absent or empty; and which
    converted. Ids of one length (Ray's are) are decoded all at once; any other column
    id by id, with binascii the judge as on the fast path."""
    inner = pc.utf8_slice_codeunits(values, 1, -1)
    inner = pc.if_else(pc.equal(inner, ""), _NO_TEXT, inner)
    set_ = inner.is_valid()
    found = _decode_at_once(inner.filter(set_))
    if found is not None:
        at = np.full(len(inner), len(found))
        at[mask(set_)] = np.arange(len(found))
        full = pa.concat_arrays([found, pa.nulls(1, pa.string())]).take(pa.array(at))
        return full, np.ones(len(values), dtype=bool)
    return _decode_one_by_one(inner, cache)


_NO_TEXT: Final = pa.scalar(None, pa.string())
_SIXES: Final = np.full(256, 255, dtype=np.uint8)
_SIXES[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                     dtype=np.uint8)] = np.arange(64, dtype=np.uint8)
_SIXES[ord("=")] = 0
_HEX: Final = np.frombuffer(b"".join(b"%02x" % i for i in range(256)),
                            dtype=np.uint8).reshape(256, 2)


def _decode_at_once(ids: pa.Array) -> pa.Array | None:
    """base64 ids of one length and padding -> hex; None for any other column."""
    if not len(ids):
        return pa.array([], pa.string())
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32)[ids.offset:ids.offset + len(ids) + 1]
    width = int(offsets[1] - offsets[0])
    if width % 4 or np.any(np.diff(offsets) != width):
        return None
    chars = np.frombuffer(ids.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    chars = chars.reshape(len(ids), width)
    pad = int(chars[0, -1] == ord("=")) + int(chars[0, -2] == ord("="))
    if np.any((chars[:, -1] == ord("=")) != (pad >= 1)) or \
            np.any((chars[:, -2] == ord("=")) != (pad == 2)):
        return None
    sixes = _SIXES[chars].reshape(len(ids), width // 4, 4).astype(np.uint32)
    words = (sixes[..., 0] << 18) | (sixes[..., 1] << 12) | (sixes[..., 2] << 6) | sixes[..., 3]
    raw = np.stack([words >> 16, words >> 8, words], axis=-1).astype(np.uint8)
    raw = raw.reshape(len(ids), -1)[:, :raw.shape[1] * 3 - pad] if pad else \
        raw.reshape(len(ids), -1)
    text = _HEX[raw].reshape(len(ids), -1)
    size = text.shape[1]
    hex_offsets = np.arange(0, (len(ids) + 1) * size, size, dtype=np.int32)
    return pa.StringArray.from_buffers(len(ids), pa.py_buffer(hex_offsets),
                                       pa.py_buffer(np.ascontiguousarray(text)))


def _decode_one_by_one(inner: pa.Array, cache: bool) -> tuple[pa.Array, np.ndarray]:
    distinct = pc.unique(inner)
    hexes: list[str | None] = []
    bad: list[Any] = []
    for value in distinct.to_pylist():
        try:
            hexes.append(b64_hex(value, "id", cache) if value is not None else None)
        except RayValueError:
            hexes.append(None)
            bad.append(value)
    found = pa.array(hexes, pa.string()).take(pc.index_in(inner, distinct))
    failed = mask(pc.is_in(inner, pa.array(bad, pa.string()))) if bad \
        else np.zeros(len(inner), dtype=bool)
    return found, ~failed


def times_ns(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Quoted time texts (already matched) -> UTC ns; and which converted. One cast for
    all, as `columns.py` does; a text naming no real day (Feb 30) declines its event."""
    texts = pc.utf8_slice_codeunits(values, 1, -1)
    try:
        return texts.cast(_UTC_NS), np.ones(len(values), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        parsed = [_one_time(t) for t in texts.to_pylist()]
        ok = np.array([t is not None for t in parsed], dtype=bool) | mask(texts.is_null())
        return pa.array(parsed, pa.int64()).cast(_UTC_NS), ok


def _one_time(text: str | None) -> int | None:
    try:
        return None if text is None else int(pa.scalar(text).cast(_UTC_NS).value)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def int32s(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """JSON integers (absent: 0) -> int32; and which are integers in range."""
    ok = _matching([Leaf(values)], _INT)[0] | ~Leaf(values).valid
    numbers = pc.if_else(pa.array(ok), values, pa.scalar(None, pa.string()))
    wide = numbers.cast(pa.int64()).fill_null(0)
    in_range = mask(pc.and_(pc.greater_equal(wide, -2**31), pc.less(wide, 2**31)))
    return wide.cast(pa.int32(), safe=False), ok & in_range
