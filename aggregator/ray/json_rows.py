"""The rows of the events the columnar path takes, built whole columns at a time from
what `json_columns` read: the same rows, values and order the fast path (`fast.py`)
gives for those events, one per definition and one per transition of a lifecycle event.

`json_checks` says which events are taken; a value that then fails to convert (an id
binascii refuses, a day that does not exist) or a definition whose shape the fast path
declines drops its event from the taken ones, for `batch.py` to map the Python way.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggregator.decode.normalize import Stamp
from aggregator.ray import json_checks as check
from aggregator.ray import json_values as convert
from aggregator.ray.json_attrs import Definitions, LifecycleAttrs
from aggregator.ray.json_checks import field
from aggregator.ray.json_columns import DEFINITIONS, LIFECYCLE_KEY
from aggregator.ray.task_shapes import STATE_OF, task_state
from sinks.schema import EVENT_SCHEMA

_SUFFIXES: Final = pa.array([f"-{i}" for i in range(64)], pa.string())
_NO_TEXT: Final = pa.scalar(None, pa.string())


class ColumnarBody:
    """A body read by `json_columns`: which events the columnar path takes and their
    eventIds (the dedupe keys) at once; their rows once the dedupe said which are new."""

    def __init__(self, table: pa.Table, stamp: Stamp) -> None:
        self._texts = table.column("text")
        body = check.Body(table)
        self._event, self._stamp = body.event, stamp
        self.taken = check.sure(body)
        ids = pc.utf8_slice_codeunits(field(self._event, "eventId"), 1, -1)
        self.event_ids: list[str | None] = ids.filter(pa.array(self.taken)).to_pylist()

    def text(self, index: int) -> str | None:
        """An event's minified JSON text, for the Python path to parse."""
        found: str | None = self._texts[index].as_py()
        return found

    def rows(self, fresh: np.ndarray) -> tuple[pa.RecordBatch, np.ndarray, list[int]]:
        """The rows of the fresh taken events, in the body's order, and each row's event;
        and the events that failed to convert after all, for the Python path."""
        wanted = self.taken & fresh
        places = np.nonzero(wanted)[0]
        mapped = _Mapped(self._event.take(pa.array(places)), self._stamp)
        failed = places[mapped.failed].tolist()
        if failed:  # one more pass without them: each event fails on its own
            wanted[failed] = False
            places = np.nonzero(wanted)[0]
            mapped = _Mapped(self._event.take(pa.array(places)), self._stamp)
            assert not mapped.failed.any()
        return mapped.batch, places[mapped.row_events], failed


def _definition_payload(event: pa.Array) -> pa.Array:
    return pc.coalesce(*(field(event, key) for key in DEFINITIONS.values()))


class _Mapped:
    """The rows of taken events (`events`), and which of them failed to convert."""

    def __init__(self, events: pa.Array, stamp: Stamp) -> None:
        life_payload = field(events, LIFECYCLE_KEY)
        payload = _definition_payload(events)
        life = check.mask(life_payload.is_valid())
        hexes, failed = self._ids(events, life_payload, payload)
        attempts = convert.int32s(pc.coalesce(field(life_payload, "taskAttempt"),
                                            field(payload, "taskAttempt")))[0]
        envelope_ns, envelope_ok = _envelope_times(field(events, "timestamp"), stamp)
        steps = life_payload.take(pa.array(np.nonzero(life)[0])).field("stateTransitions") \
            if life.any() else pa.array([], pa.list_(pa.struct([])))
        step_ns, step_states, step_ok = _steps(steps)
        definitions = Definitions(events.filter(pa.array(~life)),
                                  payload.filter(pa.array(~life)), stamp)
        life_attrs = LifecycleAttrs(events.filter(pa.array(life)),
                                    life_payload.filter(pa.array(life)))
        failed |= ~envelope_ok
        failed[life] |= ~step_ok | life_attrs.failed
        failed[~life] |= definitions.failed()
        self.failed = failed
        counts = np.ones(len(events), dtype=np.int64)
        counts[life] = check.list_lengths(steps)
        self.row_events = np.repeat(np.arange(len(events)), counts)
        self.batch = _Rows(stamp, life, counts, self.row_events).build(
            hexes, attempts, envelope_ns, step_ns, step_states, definitions, life_attrs)

    def _ids(self, events: pa.Array, life: pa.Array,
             payload: pa.Array) -> tuple[dict[str, pa.Array], np.ndarray]:
        texts = {"event_id": field(events, "eventId"), "envelope_node": field(events, "nodeId"),
                 "task_id": pc.coalesce(field(life, "taskId"), field(payload, "taskId")),
                 "job_id": pc.coalesce(field(life, "jobId"), field(payload, "jobId")),
                 "own_node": field(life, "nodeId"), "worker_id": field(life, "workerId"),
                 "parent_id": field(payload, "parentTaskId"),
                 "actor_id": field(payload, "actorId")}
        failed = np.zeros(len(events), dtype=bool)
        hexes = {}
        for name, values in texts.items():
            hexes[name], ok = convert.hex_ids(values, cache=name != "event_id")
            failed |= ~ok
        return hexes, failed


def _envelope_times(texts: pa.Array, stamp: Stamp) -> tuple[np.ndarray, np.ndarray]:
    """Each event's own time in ns: its timestamp, or the receive time when it has none."""
    unset = check.mask(texts.is_null()) | check.mask(pc.equal(texts, '""'))
    parsed, ok = convert.times_ns(pc.if_else(pa.array(unset), _NO_TEXT, texts))
    ns = parsed.cast(pa.int64()).fill_null(stamp.received_ns).to_numpy(zero_copy_only=False)
    return np.asarray(ns, dtype=np.int64), ok | unset


def _steps(steps: pa.Array) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """Every transition's time in ns and Ray's state, flat; and which events converted."""
    flat = steps.flatten()
    if not len(flat):
        return np.zeros(0, dtype=np.int64), pa.array([], pa.string()), \
            np.ones(len(steps), dtype=bool)
    parsed, ok = convert.times_ns(field(flat, "timestamp"))
    ns = np.asarray(parsed.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                    dtype=np.int64)
    states = pc.utf8_slice_codeunits(field(flat, "state"), 1, -1)
    parents = np.asarray(pc.list_parent_indices(steps))
    bad = np.bincount(parents[~ok], minlength=len(steps))
    return ns, states, bad == 0


class _Rows:
    """The EVENT_SCHEMA rows of mapped events: one per definition, one per transition."""

    def __init__(self, stamp: Stamp, life: np.ndarray, counts: np.ndarray,
                 row_events: np.ndarray) -> None:
        self.stamp = stamp
        self.rows = int(counts.sum())
        self.parents = pa.array(row_events)
        starts = np.cumsum(counts) - counts
        self.index_in_event = np.arange(self.rows) - starts[row_events]
        self.many = counts[row_events] > 1
        self.life_row = life[row_events]
        step_counts = np.where(life, counts, 0)
        self.step_index = (np.cumsum(step_counts) - step_counts)[row_events] \
            + self.index_in_event
        self.life_rank = np.cumsum(life) - 1  # an event's place among the lifecycle ones
        self.definition_rank = np.cumsum(~life) - 1

    def build(self, hexes: dict[str, pa.Array], attempts: pa.Array, envelope_ns: np.ndarray,
              step_ns: np.ndarray, step_states: pa.Array, definitions: Definitions,
              life_attrs: LifecycleAttrs) -> pa.RecordBatch:
        per_event = {name: values.take(self.parents) for name, values in hexes.items()}
        life_rows = pa.array(self.life_row)
        steps = pa.array(np.where(self.life_row, self.step_index, 0))
        raw_states = step_states.take(steps) if len(step_states) \
            else pa.nulls(self.rows, pa.string())
        columns = {
            "event_id": self._event_ids(per_event["event_id"]),
            "time": pa.array(np.where(self.life_row, step_ns[steps.to_numpy()] if len(step_ns)
                                      else 0, envelope_ns[self.parents.to_numpy()]),
                             pa.int64()).cast(EVENT_SCHEMA.field("time").type),
            "kind": pa.repeat(pa.scalar("task"), self.rows),
            "source": pa.repeat(pa.scalar("ray"), self.rows),
            "name": self._definition_only(definitions.name_column()),
            "state": pc.if_else(life_rows, _our_states(raw_states), "DEFINED"),
            "task_id": per_event["task_id"], "attempt": attempts.take(self.parents),
            "parent_id": per_event["parent_id"], "job_id": per_event["job_id"],
            "node_id": pc.coalesce(per_event["own_node"], per_event["envelope_node"],
                                   pa.scalar(self.stamp.node_id or None, pa.string())),
            "worker_id": per_event["worker_id"],
            "actor_id": pc.coalesce(per_event["actor_id"], self._creation_actors(
                per_event["task_id"], definitions)),
            "host": pa.repeat(pa.scalar(self.stamp.host or None, pa.string()), self.rows),
            "attrs": self._attrs(definitions, life_attrs, raw_states),
        }
        return self._batch(columns)

    def _event_ids(self, hexes: pa.Array) -> pa.Array:
        """The event's id in hex, plus "-<i>" when it gives several rows."""
        suffixes = _SUFFIXES.take(pa.array(np.minimum(self.index_in_event, 63)))
        suffixes = pc.if_else(pa.array(self.many), suffixes, "")
        return pc.binary_join_element_wise(hexes, suffixes, "")

    def _definition_only(self, values: pa.Array) -> pa.Array:
        """A definition event's value on its row, null on lifecycle rows."""
        index = np.where(self.life_row, len(values), self.definition_rank[self.parents])
        return pa.concat_arrays([values, pa.nulls(1, values.type)]).take(pa.array(index))

    def _creation_actors(self, task_ids: pa.Array, definitions: Definitions) -> pa.Array:
        """An actor creation task's actor: its task id after 8 bytes of 0xff."""
        creation = pc.and_(pc.equal(self._definition_only(definitions.task_types()),
                                    "ACTOR_CREATION_TASK"),
                           pc.and_(pc.equal(pc.binary_length(task_ids), 48),
                                   pc.starts_with(task_ids, "f" * 16)))
        return pc.if_else(creation.fill_null(False), pc.utf8_slice_codeunits(task_ids, 16),
                          _NO_TEXT)

    def _attrs(self, definitions: Definitions, life_attrs: LifecycleAttrs,
               raw_states: pa.Array) -> pa.Array:
        life_rows = np.nonzero(self.life_row)[0]
        events = self.life_rank[self.parents.to_numpy()[life_rows]]
        life_maps = life_attrs.rows(events, raw_states.take(pa.array(life_rows)))
        definition_maps = definitions.attrs_column()
        index = np.where(self.life_row, len(definition_maps)
                         + np.cumsum(self.life_row) - 1, self.definition_rank[self.parents])
        return pa.concat_arrays([definition_maps, life_maps]).take(pa.array(index))

    def _batch(self, columns: dict[str, pa.Array]) -> pa.RecordBatch:
        stamp, rows = self.stamp, self.rows
        columns["pid"] = pa.repeat(pa.scalar(stamp.pid, pa.int32()), rows)
        columns["uid"] = pa.repeat(pa.scalar(stamp.uid, pa.int32()), rows)
        columns["received"] = pa.repeat(
            pa.scalar(stamp.received_ns, EVENT_SCHEMA.field("received").type), rows)
        arrays = [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(rows, f.type)
                  for f in EVENT_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


def _our_states(raw: pa.Array) -> pa.Array:
    """Ray's task states -> ours, one lookup per distinct state."""
    distinct = pc.unique(raw)
    ours = [None if s is None else STATE_OF.get(s) or task_state(s) for s in distinct.to_pylist()]
    return pa.array(ours, pa.string()).take(pc.index_in(raw, distinct))
