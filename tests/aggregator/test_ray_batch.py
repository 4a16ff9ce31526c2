"""The columnar Ray path (`ray_batch`: fast path + careful fallback, Arrow built directly)
against the reference: `ray_events_to_rows` then `normalize.rows_to_batch`, the path every
Ray event took before. Same rows, same order, same values, same map entry order; the
same reasons for what is refused.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.normalize import Stamp, normalize_event, rows_to_batch
from aggregator.ray_batch import ray_body_to_batch, ray_items_to_batch
from aggregator.ray_columns import row_of_event, rows_to_record_batch
from aggregator.ray_events import RayBodyError, RecentEventIds, ray_events_to_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ray"
ALL_FIXTURES = sorted(FIXTURES.glob("*.json"))
TASK_TYPES = {"TASK_DEFINITION_EVENT", "ACTOR_TASK_DEFINITION_EVENT", "TASK_LIFECYCLE_EVENT",
              "TASK_EXECUTION_EVENT"}
STAMPS = [Stamp(1_700_000_000_123_456_789, None, None, "agent-node", "agent-host"),
          Stamp(1_700_000_000_000_000_001, 7, 1000, "", "")]


def load(name: str) -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / name).read_text())
    return data["events"] if isinstance(data, dict) else data


def all_samples() -> list[dict[str, Any]]:
    return [event for path in ALL_FIXTURES for event in load(path.name)]


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


ODD_CHANGES = [_no_event_id, _bad_base64_id, _numeric_name, _huge_attempt, _func_not_an_object,
               _odd_transition_Lifecycle, _stateless_transition_Lifecycle,
               _many_transitions_Lifecycle, _payload_not_an_object_Lifecycle,
               _pid_as_text_Lifecycle]


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
        {"kind": "loss", "time": 5, "event_id": "e", "source": "evagg"},
    ]
    for stamp in STAMPS:
        rows = [row_of_event(normalize_event(e, stamp)) for e in events]
        reference = rows_to_batch(events, stamp).batch
        built = rows_to_record_batch(rows, stamp)
        assert built.equals(reference.set_column(  # event ids the agent made up differ
            0, "event_id", built.column("event_id")))
        assert built.column("event_id")[2].as_py() == "e"


# ---- whole bodies: parse, dedupe, indexes ------------------------------------------------


def test_a_resent_body_is_all_duplicates_once_confirmed() -> None:
    recent = RecentEventIds()
    body = json.dumps(generated_events(30)).encode()
    first = ray_body_to_batch(body, recent, STAMPS[0])
    assert (first.batch.num_rows, first.duplicates, len(first.fresh_ids)) == (60, 0, 30)
    again = ray_body_to_batch(body, recent, STAMPS[0])  # not confirmed yet: still new
    assert again.batch.num_rows == 60
    recent.confirm(first.fresh_ids)
    resent = ray_body_to_batch(body, recent, STAMPS[0])
    assert (resent.batch.num_rows, resent.duplicates, resent.fresh_ids) == (0, 30, [])
    assert resent.normalized.rejected == []


def test_repeats_within_a_body_and_events_without_ids() -> None:
    events = generated_events(3)
    no_id = {k: v for k, v in events[0].items() if k != "eventId"}
    body = json.dumps([events[0], events[1], events[0], no_id, no_id, 5]).encode()
    with pytest.raises(RayBodyError, match="event 5 must be a JSON object"):
        ray_body_to_batch(body, RecentEventIds(), STAMPS[0])
    body = json.dumps([events[0], events[1], events[0], no_id, no_id]).encode()
    result = ray_body_to_batch(body, RecentEventIds(), STAMPS[0])
    assert result.duplicates == 1
    assert result.fresh_ids == [events[0]["eventId"], events[1]["eventId"]]
    ids = plain(result.batch)
    assert len({r["event_id"] for r in ids}) == len(ids) - 1  # the two copies without an id


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
    fresh, ids = recent.split_new(items)
    assert [i in fresh for i in range(len(items))] == recent.filter_new(items)
    assert ids == ["b", "c", "d"]


# ---- helpers -----------------------------------------------------------------------------


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def generated_events(count: int) -> list[dict[str, Any]]:
    """Bodies the way a busy Ray node sends them: per task its definition, the owner's
    lifecycle event and the executor's RUNNING event; one task in 5 fails."""
    running, _, definition, owner, _, failed = load(
        "02_excerpt_task_lifecycle_normal_and_failed.json")
    out: list[dict[str, Any]] = []
    for task in range(count // 3 + 1):
        task_id = b64(os.urandom(8) + b"\xff" * 12 + b"\x01\x00\x00\x00")
        for template in (definition, failed if task % 5 == 4 else owner, running):
            event = copy.deepcopy(template)
            event["eventId"] = b64(os.urandom(28))
            payload = event.get("taskLifecycleEvent") or event["taskDefinitionEvent"]
            payload["taskId"] = task_id
            out.append(event)
    return out[:count]


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
