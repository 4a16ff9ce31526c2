"""The columnar Ray path (`aggregator.ray.batch`: fast path, careful fallback, Arrow direct)
against the reference: `ray_events_to_rows` then `normalize.rows_to_batch`, the path every
Ray event took before. Same rows, same order, same values, same map entry order; the
same reasons for what is refused.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.decode.normalize import Stamp, normalize_event, rows_to_batch
from aggregator.ray import batch as ray_batch
from aggregator.ray import events as ray_events
from aggregator.ray import fast as ray_fast
from aggregator.ray import values as ray_values
from aggregator.ray.batch import ray_body_to_batch, ray_items_to_batch
from aggregator.ray.columns import row_of_event, rows_to_record_batch
from aggregator.ray.dedupe import Claim, ray_event_id
from aggregator.ray.events import RayBodyError, RecentEventIds, ray_events_to_rows
from tests.aggregator.ray.samples import ALL_FIXTURES, all_samples, b64, generated_events, load

TASK_TYPES = {"TASK_DEFINITION_EVENT", "ACTOR_TASK_DEFINITION_EVENT", "TASK_LIFECYCLE_EVENT",
              "TASK_EXECUTION_EVENT", "TASK_PROFILE_EVENT"}  # the fast path's
PROFILES = "07_excerpt_task_profile_events_camelCase.json"
STAMPS = [Stamp(1_700_000_000_123_456_789, None, None, "agent-node", "agent-host"),
          Stamp(1_700_000_000_000_000_001, 7, 1000, "", "")]


def plain(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows with timestamps as integer ns (to_pylist cannot make datetimes of them)."""
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist()


def assert_same_as_reference(items: list[Any], stamp: Stamp = STAMPS[0]) -> int:
    """The columnar batch equals the reference; returns how many events went careful."""
    rows, rejected = ray_events_to_rows(items)
    reference = rows_to_batch(rows, stamp)
    result = ray_items_to_batch(list(enumerate(items)), stamp)
    assert plain(result.batch) == plain(reference.batch)
    assert result.batch.equals(reference.batch)
    # The reference numbers a row's refusal by its row, the columnar path by its event.
    reasons = sorted(r for _, r in rejected + reference.rejected)
    assert sorted(r for _, r in result.normalized.rejected) == reasons
    assert all(0 <= i < len(items) for i, _ in result.normalized.rejected)
    return result.careful


@pytest.mark.parametrize("stamp", STAMPS, ids=["node-and-host", "bare"])
@pytest.mark.parametrize("path", ALL_FIXTURES, ids=[p.name for p in ALL_FIXTURES])
def test_captured_payloads_give_the_reference_rows(path: Path, stamp: Stamp) -> None:
    items = load(path.name)
    assert assert_same_as_reference(items, stamp) == others(items)


def test_snake_case_payloads_give_the_reference_rows() -> None:
    items = [_to_snake(item) for item in all_samples()]
    assert assert_same_as_reference(items) == others(items)


def others(items: list[dict[str, Any]]) -> int:
    """How many events are not task events (the careful path's to map)."""
    return sum(1 for i in items if (i.get("eventType") or i.get("event_type")) not in TASK_TYPES)


def test_ray_249_task_execution_events_give_the_reference_rows() -> None:
    items = [ray_249_event(i) for i in range(6)]
    items[1]["taskExecutionEvent"]["rayErrorInfo"] = {}
    items[2]["taskExecutionEvent"]["taskState"] = {}  # no transitions: one row
    items[3]["taskExecutionEvent"]["taskState"] = {"8": "2025-08-01T10:00:01Z", "99": "2025-08-01T"
                                                   "10:00:00.1Z"}  # a status we do not know
    items[4]["taskExecutionEvent"]["taskState"] = {"x": "2025-08-01T10:00:00Z"}  # refused
    items[5]["taskExecutionEvent"].pop("rayErrorInfo")
    assert assert_same_as_reference(items) == 1  # the refused one


def test_fields_ray_adds_to_a_transition_are_kept_on_that_transition_s_row() -> None:
    items = generated_events(6)
    lifecycle = next(i for i in items if len(
        i.get("taskLifecycleEvent", {}).get("stateTransitions", [])) > 1)
    transitions = lifecycle["taskLifecycleEvent"]["stateTransitions"]
    transitions[1]["newPerTransitionField"] = "x"
    transitions[1]["someCount"] = "0"  # an int64 at its default: not kept
    assert assert_same_as_reference(items) == 1  # that event declines the fast path
    rows, _ = ray_events_to_rows([lifecycle])
    kept = [r["attrs"].get("ray_new_per_transition_field") for r in rows]
    assert kept == [None, "x"] + [None] * (len(rows) - 2)
    assert all("ray_some_count" not in r["attrs"] for r in rows)


@pytest.mark.parametrize("odd_id", ["not-base64-id", "AA", 5])
def test_an_event_id_in_another_form_keeps_the_event_under_a_digest(odd_id: Any) -> None:
    items = generated_events(3)
    items[1]["eventId"] = odd_id
    assert assert_same_as_reference(items) == 1  # declined to the careful path, kept there
    rows, rejected = ray_events_to_rows([items[1]])
    assert rejected == [] and rows
    assert {r["attrs"]["ray_event_id"] for r in rows} == {ray_values.text(odd_id)}
    assert all(re.fullmatch(r"[0-9a-f]{56}(-\d+)?", r["event_id"]) for r in rows)
    again, _ = ray_events_to_rows([copy.deepcopy(items[1])])
    assert [r["event_id"] for r in again] == [r["event_id"] for r in rows]  # stable


def test_generated_ray_bodies_take_the_fast_path() -> None:
    items = generated_events(300)
    assert assert_same_as_reference(items) == 0


@pytest.mark.parametrize("text", [
    "2026-11-29T12:05:22.487696773Z",  # Ray's own shape
    "2026-11-29T12:05:22Z", "2026-11-29T12:05:22.5Z", "2026-11-29T12:05:22.123456+02:00",
    "2026-11-29T12:05:22.487Z", "2026-11-29T12:05:22.487696Z", "2026-11-29T12:05:22.Z",
    "2026-11-29 12:05:22.487696773Z", "2026-11-29t12:05:22.487696773z",
    "1969-12-31T23:59:59.999999999Z",  # before 1970: that row is refused
    "2262-04-11T23:47:16.854775808Z",  # past int64 ns: refused
    "2026-02-29T00:00:00.000000000Z", "2026-12-31T23:59:60.000000000Z",  # no such time
    "2026-11-29T12:05:22.4876967731Z", "yesterday", "", "0",
    "2026-11-29", "2026-11-29T12", "2026-11-29T12:05", "2026-11-29T12:05:22.48769677Z+0",
])
def test_time_texts_of_any_shape_give_the_reference_rows(text: str) -> None:
    items = copy.deepcopy(load("02_excerpt_task_lifecycle_normal_and_failed.json"))
    items[3]["taskLifecycleEvent"]["stateTransitions"][1]["timestamp"] = text
    items[2]["timestamp"] = text  # the definition's time is the envelope's
    assert_same_as_reference(items)
    assert_same_as_reference(items + generated_events(9))  # one odd text in a bulk batch


def test_protobuf_fraction_digits_stay_on_the_bulk_time_cast() -> None:
    """Protobuf prints 0, 3, 6 or 9 fraction digits (a clock in microseconds gives 6 on
    every event): all of them convert in one cast; any other text, one by one."""
    events = generated_events(12)
    stamps = ["2026-11-29T12:05:22Z", "2026-11-29T12:05:22.487Z", "2026-11-29T12:05:22.487696Z"]
    for index, event in enumerate(events):
        event["timestamp"] = stamps[index % 3]
        for t in (event.get("taskLifecycleEvent") or {}).get("stateTransitions", []):
            t["timestamp"] = stamps[(index + 1) % 3]
    assert_same_as_reference(events)
    assert not ray_items_to_batch(list(enumerate(events)), STAMPS[0]).times_one_by_one
    events[3]["timestamp"] = "2026-11-29T12:05:22.487+00:00"  # a definition: its time
    assert_same_as_reference(events)
    assert ray_items_to_batch(list(enumerate(events)), STAMPS[0]).times_one_by_one


def test_errors_go_on_the_last_failed_transition_and_nodes_default_to_the_agents() -> None:
    events = generated_events(15)
    twice = events[13]["taskLifecycleEvent"]  # the owner's event of a task that failed
    twice["stateTransitions"] = [{**t, "state": "FAILED"} for t in twice["stateTransitions"]]
    twice["stateTransitions"][-1]["state"] = "RUNNING"
    twice["rayErrorInfo"]["errorMessage"] += "\n"  # and an extra field
    twice["rayErrorInfo"]["errorDetail"] = {"code": 3}
    never = events[4]["taskLifecycleEvent"]  # error info but no FAILED: the last row
    never["rayErrorInfo"] = {"errorType": "WORKER_DIED", "errorMessage": "gone"}
    for event in events[6:9]:  # no node anywhere: the agent's own
        event.pop("nodeId")
        payload = event.get("taskLifecycleEvent") or event["taskDefinitionEvent"]
        payload.pop("nodeId", None)
    assert assert_same_as_reference(events) == 0
    assert assert_same_as_reference(events, STAMPS[1]) == 0


def test_odd_task_events_fall_back_to_the_careful_path() -> None:
    base = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    odd: list[Any] = []
    for change in ODD_CHANGES:
        item = copy.deepcopy(base[3] if "Lifecycle" in change.__name__ else base[2])
        change(item)
        odd.append(item)
    careful = assert_same_as_reference(odd)
    assert careful == len(odd)


def _no_event_id(e: dict[str, Any]) -> None:
    e.pop("eventId")


def _bad_base64_id(e: dict[str, Any]) -> None:
    e["eventId"] = "not base64!"


def _numeric_name(e: dict[str, Any]) -> None:
    e["taskDefinitionEvent"]["taskName"] = 7


def _huge_attempt(e: dict[str, Any]) -> None:
    e["taskDefinitionEvent"]["taskAttempt"] = str(2**40)


def _func_not_an_object(e: dict[str, Any]) -> None:
    e["taskDefinitionEvent"]["taskFunc"] = "square"


def _odd_transition_Lifecycle(e: dict[str, Any]) -> None:
    e["taskLifecycleEvent"]["stateTransitions"].insert(1, "RUNNING")


def _stateless_transition_Lifecycle(e: dict[str, Any]) -> None:
    e["taskLifecycleEvent"]["stateTransitions"][0].pop("state")


def _many_transitions_Lifecycle(e: dict[str, Any]) -> None:
    e["taskLifecycleEvent"]["stateTransitions"] *= 20  # 80 rows


def _payload_not_an_object_Lifecycle(e: dict[str, Any]) -> None:
    e["taskLifecycleEvent"] = []


def _pid_as_text_Lifecycle(e: dict[str, Any]) -> None:
    e["taskLifecycleEvent"]["workerPid"] = "12x"


def _odd_values(key: str, *values: Any) -> list[Callable[[dict[str, Any]], None]]:
    """One change per value, in order: each of 1, True and 1.0 is the same dict key, so the
    second and later would meet the first one's cache entry if the fast path cached them.
    The envelope has no extra field, so the fast path would take its cache."""
    changes: list[Callable[[dict[str, Any]], None]] = []
    for value in values:
        def change(e: dict[str, Any], value: Any = value) -> None:
            e.pop("_captured_in", None)
            payload = e.get("taskDefinitionEvent")
            if key in ("sessionName", "severity") or payload is None:
                e[key] = value
            else:
                payload["taskFunc"]["pythonFunctionDescriptor"][key] = value
        change.__name__ = f"_{key}_is_{value!r}"
        changes.append(change)
    return changes


ODD_CHANGES = [_no_event_id, _bad_base64_id, _numeric_name, _huge_attempt, _func_not_an_object,
               _odd_transition_Lifecycle, _stateless_transition_Lifecycle,
               _many_transitions_Lifecycle, _payload_not_an_object_Lifecycle,
               _pid_as_text_Lifecycle,
               *_odd_values("sessionName", True, 1, 1.0, False, 0),
               *_odd_values("severity", 1, True, 0.0, False),
               *_odd_values("moduleName", 1, 1.0, True),
               *_odd_values("className", 0, 1, True),
               *_odd_values("functionName", 2, 2.0)]


def test_odd_envelope_values_of_lifecycle_events_fall_back_too() -> None:
    base = load("02_excerpt_task_lifecycle_normal_and_failed.json")[3]
    odd = []
    for session in (True, 1, 1.0):
        item = copy.deepcopy(base)
        item.pop("_captured_in", None)
        item["sessionName"] = session
        odd.append(item)
    assert assert_same_as_reference(odd) == len(odd)


def _profile(e: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = e["taskProfileEvents"]["profileEvents"]
    return found


PROFILE_CHANGES: list[Callable[[dict[str, Any]], None]] = [
    lambda e: _profile(e).update(events=[]),  # nothing timed: the event is kept whole
    lambda e: e["taskProfileEvents"].pop("profileEvents"),
    lambda e: _profile(e).update(events="task:execute"),
    lambda e: _profile(e)["events"].append("task:execute"),
    lambda e: _profile(e)["events"][0].update(eventName=5),
    lambda e: _profile(e)["events"][0].update(startTime="12x"),
    lambda e: _profile(e)["events"][0].update(startTime=str(2**64)),  # past int64 ns
    lambda e: _profile(e)["events"][0].update(startTime="-5"),
    lambda e: _profile(e).update(componentId=7),
    lambda e: e["taskProfileEvents"].update(attemptNumber=str(2**40)),
]


@pytest.mark.parametrize("change", range(len(PROFILE_CHANGES)))
def test_odd_profile_events_fall_back_to_the_careful_path(change: int) -> None:
    """Each odd shape is declined and the careful path maps it, keeps it whole or refuses
    it with its reason; the good events beside it take the fast path."""
    events = load(PROFILES)
    profile = next(e for e in events if e["eventType"] == "TASK_PROFILE_EVENT")
    PROFILE_CHANGES[change](profile)
    assert assert_same_as_reference(events) == 1


def test_profile_events_take_the_fast_path_with_their_odd_but_valid_values() -> None:
    """What the fast path takes as it is: no times (the envelope's), an end before the
    start (no duration), an int64 as a JSON number, a worker-less component, extra fields."""
    events = [e for e in load(PROFILES) if e["eventType"] == "TASK_PROFILE_EVENT"]
    first, second = _profile(events[0]), _profile(events[1])
    first["events"][0].pop("startTime")
    first["events"][1]["endTime"] = "1"
    first["events"][2]["startTime"] = 1796589877251474744
    first["events"][3]["extraThing"] = {"a": 1}
    second.update(componentType="driver", newField="x")
    assert assert_same_as_reference(events) == 0


def test_a_driver_s_profile_event_of_hundreds_of_entries_takes_the_fast_path() -> None:
    """A driver records a `submit_task` entry per task it submits, all in one event."""
    events = [e for e in load(PROFILES) if e["eventType"] == "TASK_PROFILE_EVENT"]
    entry = _profile(events[0])["events"][0]
    _profile(events[0])["events"] = [{**entry, "eventName": "submit_task"}] * 300
    assert assert_same_as_reference(events) == 0
    rows = ray_items_to_batch(list(enumerate(events)), STAMPS[0]).batch
    assert rows.column("event_id")[299].as_py().endswith("-299")


# ---- caches: shrunk, cleared, bounded in size -------------------------------------------

CACHES: list[dict[Any, Any]] = [ray_fast._ENVELOPE_ATTRS, ray_fast._FUNCTIONS, ray_values.HEX_CACHE,
          ray_values._EXTRA_NAMES, ray_values._ENVS, ray_values._SECONDS,
          ray_values._SNAKE_OF]


@pytest.fixture
def tiny_caches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every cache of the Ray mapping holds two entries, so entries evict all the time."""
    for module, name in ((ray_fast, "ENVELOPE_CACHE_SIZE"), (ray_fast, "FUNCTION_CACHE_SIZE"),
                         (ray_values, "HEX_CACHE_SIZE"), (ray_values, "NAMES_CACHE_SIZE"),
                         (ray_values, "ENV_CACHE_SIZE")):
        monkeypatch.setattr(module, name, 2)
    yield
    clear_caches()


def clear_caches() -> None:
    for cache in CACHES:
        cache.clear()


def test_shrunk_and_cleared_caches_give_the_reference_rows(tiny_caches: None) -> None:
    """Cache aliasing and eviction: many sessions, severities, functions and envs of
    every type, mapped in chunks with every cache cleared between chunks."""
    events = generated_events(60)
    odd_values: list[Any] = [None, "", "s", 1, True, 1.0, 0, False, "1", "True"]
    for index, event in enumerate(events):
        event.pop("_captured_in", None)
        event["sessionName"] = odd_values[index % len(odd_values)]
        event["severity"] = odd_values[(index // 3) % len(odd_values)]
        definition = event.get("taskDefinitionEvent")
        if definition is not None:
            descriptor = definition["taskFunc"]["pythonFunctionDescriptor"]
            descriptor["moduleName"] = odd_values[(index // 2) % len(odd_values)]
            descriptor["className"] = odd_values[(index // 5) % len(odd_values)]
            definition.pop("taskName")
            definition["serializedRuntimeEnv"] = json.dumps(
                {"env_vars": {"API_TOKEN": "x", "N": str(index % 4)}})
    for chunk in range(0, len(events), 7):
        assert_same_as_reference(events[chunk:chunk + 7])
        assert_same_as_reference(events[chunk:chunk + 7], STAMPS[1])
        clear_caches()
    assert_same_as_reference(events)
    assert all(len(cache) <= 2 for cache in CACHES[:5])


class ClearedBetweenLookups(dict[str, Any]):
    """A cache another decode thread clears right after an `in` test said yes."""

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        self.clear()
        return found


def test_a_cache_cleared_by_another_thread_between_lookups_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_values, "_ENVS", ClearedBetweenLookups())
    events = [e for e in generated_events(12) if "taskDefinitionEvent" in e]
    for event in events:
        event["taskDefinitionEvent"]["serializedRuntimeEnv"] = '{"pip": ["x"]}'
    assert assert_same_as_reference(events) == 0
    assert assert_same_as_reference(events * 2) == 0


def test_long_values_are_mapped_right_and_not_cached() -> None:
    clear_caches()
    long_id = b64(bytes(range(60)))  # 80 base64 characters
    assert ray_values.b64_hex(long_id, "taskId") == bytes(range(60)).hex()
    assert long_id not in ray_values.HEX_CACHE
    short_id = b64(bytes(range(48)))  # 64 characters: Ray's longest ids are 40
    assert ray_values.b64_hex(short_id, "taskId") == bytes(range(48)).hex()
    assert short_id in ray_values.HEX_CACHE

    wide = {f"field{i}": i + 1 for i in range(65)}
    names = ray_values.extra_names(wide, ray_values.K_CAMEL, ray_events.ERROR_TAKEN, "")
    assert len(names) == 65 and ("field7", "ray_field7") in names
    assert not ray_values._EXTRA_NAMES
    long_key = {"x" * 65: 1}
    assert ray_values.extra_attrs(long_key, ray_values.K_CAMEL, ray_events.ERROR_TAKEN) == {
        "ray_" + "x" * 65: "1"}
    assert not ray_values._EXTRA_NAMES and "x" * 65 not in ray_values._SNAKE_OF

    big_env = json.dumps({"env_vars": {"DB_PASSWORD": "hunter2", "PAD": "p" * 5000}})
    kept = ray_values.runtime_env(big_env)
    assert kept is not None and "hunter2" not in kept and "p" * 5000 in kept
    assert not ray_values._ENVS
    assert ray_values.runtime_env(big_env) == kept

    events = generated_events(6)  # and through both paths
    for event in events:
        payload = event.get("taskLifecycleEvent") or event["taskDefinitionEvent"]
        payload["taskId"] = long_id
        payload["jobId"] = b64(bytes(70))
    events[0]["taskDefinitionEvent"]["serializedRuntimeEnv"] = big_env
    assert assert_same_as_reference(events) == 0
    assert long_id not in ray_values.HEX_CACHE and not ray_values._ENVS


# ---- mutated real payloads -------------------------------------------------------------

EDGE_VALUES = [None, "", "0", 0, -1, 1.5, True, False, {}, [], "FAILED", "RUNNING", "x",
               2**31, -(2**31) - 1, 2**63 - 1, "AAAA", "AA==", "not base64!", "//8=",
               "2026-11-29T12:05:22.487696773Z", "2026-11-29T12:05:22Z", "1900-01-01T00:00:00Z",
               "9999-12-31T23:59:59.999999999Z", {"a": 1}, ["b"], {"errorType": "X"}]
json_leaf = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
             | st.sampled_from(EDGE_VALUES))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
SAMPLES = all_samples()


def mutated(value: Any, data: st.DataObject, depth: int = 0) -> Any:
    """A real event with some values replaced, keys dropped or added."""
    roll = data.draw(st.integers(0, 11))
    if roll == 0 or depth > 6:
        return data.draw(json_value) if roll == 0 else value
    if isinstance(value, dict):
        out = {k: mutated(v, data, depth + 1) for k, v in value.items()
               if data.draw(st.integers(0, 15)) != 0}
        if roll == 1:
            out[data.draw(st.sampled_from(["newField", "rayErrorInfo", "taskName", "x"]))] = \
                data.draw(json_value)
        return out
    if isinstance(value, list):
        return [mutated(v, data, depth + 1) for v in value]
    return value


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_payloads_give_the_reference_rows(data: st.DataObject) -> None:
    events = data.draw(st.lists(st.sampled_from(SAMPLES), min_size=1, max_size=6))
    items = orjson.loads(json.dumps([mutated(e, data) for e in events]))  # as the route reads
    assert_same_as_reference(items, data.draw(st.sampled_from(STAMPS)))


def test_row_tuples_of_any_event_build_the_batch_rows_to_batch_builds() -> None:
    """The Arrow builder takes any normalized row, not only Ray's: null and empty maps,
    metrics, nonfinite names, every column set."""
    events: list[dict[str, Any]] = [
        {"kind": "op", "name": "step", "metrics": {"loss": 0.5, "bad": float("nan")},
         "step": 3, "duration_s": 1.25, "trace_id": "ab" * 16, "run_id": "r", "host": "h"},
        {"kind": "task", "metrics": {}, "nonfinite": ["x"], "attrs": {"a": "1"}},
        {"kind": "loss", "time": 10**18, "event_id": "e", "source": "evagg"},
    ]
    for stamp in STAMPS:
        rows = [row_of_event(normalize_event(e, stamp)) for e in events]
        reference = rows_to_batch(events, stamp).batch
        built = rows_to_record_batch(rows, stamp)
        assert built.equals(reference.set_column(  # event ids the agent made up differ
            0, "event_id", built.column("event_id")))
        assert built.column("event_id")[2].as_py() == "e"


# ---- whole bodies: parse, dedupe, indexes ------------------------------------------------


def test_a_resent_body_is_held_while_in_flight_new_after_a_failed_write() -> None:
    recent = RecentEventIds()
    body = json.dumps(generated_events(30)).encode()
    first = ray_body_to_batch(body, recent, STAMPS[0])
    assert (first.batch.num_rows, first.duplicates, len(first.fresh_ids)) == (60, 0, 30)
    assert recent.in_flight == 30 and len(recent) == 0
    again = ray_body_to_batch(body, recent, STAMPS[0])  # the first one is still writing
    assert (again.batch.num_rows, again.duplicates, again.held) == (0, 0, 30)
    assert again.pending == [first.claim] and again.fresh_ids == []
    recent.settle(first.claim, stored=False)  # its write failed: the resend is new
    assert recent.in_flight == 0 and len(recent) == 0
    retry = ray_body_to_batch(body, recent, STAMPS[0])
    assert (retry.batch.num_rows, retry.held, retry.pending) == (60, 0, [])
    recent.settle(retry.claim, stored=True)
    recent.settle(retry.claim, stored=False)  # settled once: this changes nothing
    assert (recent.in_flight, len(recent)) == (0, 30)
    resent = ray_body_to_batch(body, recent, STAMPS[0])
    assert (resent.batch.num_rows, resent.duplicates, resent.fresh_ids) == (0, 30, [])
    assert resent.normalized.rejected == [] and resent.pending == []


def test_a_body_that_fails_to_map_releases_its_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    recent = RecentEventIds()
    body = json.dumps(generated_events(6)).encode()

    def broken(items: Any, stamp: Stamp) -> Any:
        raise MemoryError

    monkeypatch.setattr(ray_batch, "ray_items_to_batch", broken)
    with pytest.raises(MemoryError):
        ray_body_to_batch(body, recent, STAMPS[0])
    assert (recent.in_flight, len(recent)) == (0, 0)


def test_a_claim_settled_before_the_split_takes_no_ids() -> None:
    """The route settles its claim when it is cancelled while the thread still maps."""
    recent = RecentEventIds()
    claim = Claim()
    recent.settle(claim, stored=False)
    found = recent.split_new([{"eventId": "a"}], claim)
    assert (found.indexes, recent.in_flight, claim.ids) == ([0], 0, [])


def test_waiters_learn_the_outcome_of_a_claim() -> None:
    recent = RecentEventIds()
    first, second = Claim(), Claim()
    recent.split_new(["a", "b"], first)
    recent.split_new(["c"], second)

    async def wait_both() -> tuple[bool, bool, bool]:
        waiting = [asyncio.ensure_future(recent.outcome(c)) for c in (first, second)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiting)
        await asyncio.get_running_loop().run_in_executor(None, recent.settle, first, True)
        recent.settle(second, stored=False)
        done = [await w for w in waiting]
        return done[0], done[1], await recent.outcome(first)  # settled: answers at once

    assert asyncio.run(wait_both()) == (True, False, True)
    assert recent.filter_new(["a", "b", "c"]) == [False, False, True]


def test_repeats_within_a_body_and_events_without_ids() -> None:
    events = generated_events(3)
    no_id = {k: v for k, v in events[0].items() if k != "eventId"}
    body = json.dumps([events[0], events[1], events[0], no_id, no_id, 5]).encode()
    with pytest.raises(RayBodyError, match="event 5 must be a JSON object"):
        ray_body_to_batch(body, RecentEventIds(), STAMPS[0])
    body = json.dumps([events[0], events[1], events[0], no_id, no_id]).encode()
    result = ray_body_to_batch(body, RecentEventIds(), STAMPS[0])
    assert result.duplicates == 2  # a copy without an id is known by its content
    digest = ray_events.content_id(no_id)
    assert result.fresh_ids == [events[0]["eventId"], events[1]["eventId"],
                                base64.b64encode(bytes.fromhex(digest)).decode()]
    ids = [r["event_id"] for r in plain(result.batch)]
    assert len(set(ids)) == len(ids) and digest in ids


def test_refusals_name_the_event_by_its_place_in_the_body() -> None:
    events = generated_events(6)
    events[3]["taskDefinitionEvent"]["taskId"] = "not base64!"
    body = json.dumps([events[0], events[0], *events[1:]]).encode()  # a repeat shifts places
    result = ray_body_to_batch(body, RecentEventIds(), STAMPS[0])
    (index, reason), = result.normalized.rejected
    assert index == 4 and "TASK_DEFINITION_EVENT: taskId is not base64" in reason


@pytest.mark.parametrize("body", [b"", b"[{", b'{"eventId": "x"}', b"[1]", b"null"])
def test_malformed_bodies_refuse_the_whole_body(body: bytes) -> None:
    recent = RecentEventIds()
    with pytest.raises(RayBodyError):
        ray_body_to_batch(body, recent, STAMPS[0])
    assert len(recent) == 0


def test_split_new_agrees_with_filter_new() -> None:
    recent = RecentEventIds()
    recent.confirm(["a"])
    items: list[Any] = [{"eventId": "a"}, {"event_id": "b"}, {"eventId": "b"}, {"x": 1},
                        {"eventId": 5}, "c", {"eventId": ""}, {"event_id": "d"}]
    looked = recent.filter_new(items)
    fresh, ids, pending, held = recent.split_new(items)
    assert [i in fresh for i in range(len(items))] == looked
    by_content = [ray_event_id(items[i]) for i in (3, 6)]  # no usable eventId
    assert all(by_content) and len(set(by_content)) == 2
    assert ray_event_id(items[4]) == "5"  # as its rows keep it in attrs, for the recall
    assert (ids, pending, held) == (["b", by_content[0], "5", "c", by_content[1],
                                     "d"], [], 0)
    assert recent.filter_new(["b", "c", "d", "e"]) == [False, False, False, True]  # in flight
    again = recent.split_new(["b", "e"])
    assert (again.indexes, again.held, len(again.pending)) == ([1], 1, 1)


# ---- helpers -----------------------------------------------------------------------------


def ray_249_event(number: int) -> dict[str, Any]:
    return {
        "eventId": b64(bytes([number]) * 28), "sourceType": "CORE_WORKER",
        "eventType": "TASK_EXECUTION_EVENT", "timestamp": "2025-08-01T10:00:02Z",
        "severity": "INFO", "sessionName": "session_2025-08-01_10-00-00_000000_1",
        "taskExecutionEvent": {
            "taskId": "Ho/20jYTJ4T///////////////8BAAAA", "taskAttempt": number % 2,
            "taskState": {"12": "2025-08-01T10:00:02Z", "8": "2025-08-01T10:00:01.000200300Z",
                          "1": "2025-08-01T10:00:00.000000100Z", "5": "2025-08-01T10:00:00.5Z"},
            "rayErrorInfo": {"errorType": "WORKER_DIED", "errorMessage": "The worker died."},
            "nodeId": "9ICDcBb+TVaILC9Ret99uT7V4qFoS77oZ/foyg==", "workerId": "",
            "workerPid": 4242}}


def _to_snake(value: Any, key: str = "") -> Any:
    """What PRESERVE_PROTO_FIELD_NAME does: proto field names snake_case, map keys kept."""
    maps = {"requiredResources", "refIds", "labelSelector", "labels", "resources", "metadata"}
    if isinstance(value, dict):
        if key in maps:
            return value
        return {re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", k).lower(): _to_snake(v, k)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_to_snake(v) for v in value]
    return value


def test_an_actor_creation_task_is_stamped_with_its_actor_on_both_paths() -> None:
    """Ray's definition of an actor creation task names no actor: both paths take it
    from the task id (8 bytes of 0xff, then the actor's id), as Ray's State API shows it."""
    actor = bytes.fromhex("a5bb2facdd9ef499094add5801000000")
    (definition,) = [copy.deepcopy(e) for e in all_samples()
                     if e.get("eventType") == "TASK_DEFINITION_EVENT"][:1]
    normal = copy.deepcopy(definition)  # a normal task's id has no actor in it
    normal["eventId"] = base64.b64encode(b"another event").decode()
    definition["taskDefinitionEvent"].update(
        taskType="ACTOR_CREATION_TASK", taskId=base64.b64encode(b"\xff" * 8 + actor).decode())
    items = [definition, normal, _to_snake(definition)]
    items[2]["event_id"] = base64.b64encode(b"a third event").decode()
    assert assert_same_as_reference(items) == 0
    rows, _ = ray_events_to_rows(items)
    assert [r.get("actor_id") for r in rows] == [actor.hex(), None, actor.hex()]
