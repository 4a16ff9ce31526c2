"""The columnar path (`json_columns`, `json_checks`, `json_rows`: DuckDB reads the body,
whole columns are checked and mapped) against the careful reference: `ray_events_to_rows`
then `normalize.rows_to_batch` over the body's fresh events. Same rows, same order, same
values, same reasons for what is refused, same 400 for a body that is not Ray's JSON; and
the events it does not take, mixed in one body with those it takes, still give their rows.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.ray import batch as ray_batch
from aggregator.ray import json_columns, json_values
from aggregator.ray.batch import RayBatch, ray_body_to_batch
from aggregator.ray.events import RayBodyError, RecentEventIds, parse_ray_body, ray_events_to_rows
from tests.aggregator.ray.samples import ALL_FIXTURES, all_samples, b64, generated_events, load
from tests.aggregator.ray.shapes import STAMPS, json_value, mutated, plain

TASK_TYPES = {"TASK_DEFINITION_EVENT", "ACTOR_TASK_DEFINITION_EVENT", "TASK_LIFECYCLE_EVENT"}


@pytest.fixture(autouse=True)
def columnar_for_every_body(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Small bodies too go through the columnar path here."""
    monkeypatch.setattr(ray_batch, "COLUMNAR_MIN_BYTES", 0)
    yield


def clean(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the capture's own note, which no Ray sends (and the columnar path declines)."""
    events = copy.deepcopy(events)
    for event in events:
        event.pop("_captured_in", None)
    return events


def careful(body: bytes, stamp: Stamp) -> tuple[pa.RecordBatch, list[str]]:
    items = parse_ray_body(body)
    fresh = RecentEventIds().split_new(items).indexes
    rows, rejected = ray_events_to_rows([items[i] for i in fresh])
    reference = rows_to_batch(rows, stamp)
    return reference.batch, sorted(r for _, r in rejected + reference.rejected)


def assert_same_as_careful(body: bytes, stamp: Stamp = STAMPS[0]) -> RayBatch | None:
    """The agent's batch of `body` equals the careful reference's; None when both refuse
    the body whole."""
    try:
        expected, reasons = careful(body, stamp)
    except RayBodyError:
        with pytest.raises(RayBodyError):
            ray_body_to_batch(body, RecentEventIds(), stamp)
        return None
    result = ray_body_to_batch(body, RecentEventIds(), stamp)
    assert plain(result.batch) == plain(expected)
    assert result.batch.equals(expected)
    assert sorted(r for _, r in result.normalized.rejected) == reasons
    return result


def body_of(events: list[Any], spaced: bool = False, ascii_only: bool = True) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(events, separators=separators, ensure_ascii=ascii_only).encode()


def task_events(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e.get("eventType") in TASK_TYPES
               and not (e.get("taskLifecycleEvent") or {}).get("rayErrorInfo"))


@pytest.mark.parametrize("stamp", STAMPS, ids=["node-and-host", "bare"])
@pytest.mark.parametrize("path", ALL_FIXTURES, ids=[p.name for p in ALL_FIXTURES])
def test_recorded_payloads_give_the_careful_rows(path: Path, stamp: Stamp) -> None:
    events = clean(load(path.name))
    result = assert_same_as_careful(body_of(events, spaced=True), stamp)
    assert result is not None and result.columnar == task_events(events)


def test_busy_bodies_take_the_columnar_path_but_for_failed_tasks() -> None:
    events = clean(generated_events(300))
    for stamp in STAMPS:
        result = assert_same_as_careful(body_of(events), stamp)
        assert result is not None
        assert result.columnar == task_events(events) == 280  # one task in five fails
        assert result.careful == 0 and result.declined == 0


def test_a_body_mixing_events_taken_and_declined_gives_the_careful_rows() -> None:
    events = clean(generated_events(24))
    odd = clean(all_samples())  # actor, job, worker events and snake_case: not taken
    events[3]["eventId"] = "not base64!"  # kept under a digest by the careful path
    events[5]["newEnvelopeField"] = {"b": 1, "a": [1.5, None]}  # Ray adds a field
    events[7]["taskLifecycleEvent"]["taskAttempt"] = "1"  # an int64 as a string
    events[8]["timestamp"] = "2026-11-29T12:05:22.123+02:00"  # an offset
    events[10]["taskLifecycleEvent"]["stateTransitions"].reverse()  # out of order: taken
    events[11]["taskLifecycleEvent"]["workerPid"] = 0
    events[13]["taskLifecycleEvent"]["taskId"] = 7  # refused by the careful path
    mixed = [*events[:6], *odd, *events[6:], events[2]]  # and a repeat of one
    result = assert_same_as_careful(body_of(mixed))
    assert result is not None and result.duplicates == 1
    assert 0 < result.columnar < len(mixed) - 1
    declined = {3, 5, 7, 8, 13}
    kept = [e for i, e in enumerate(events) if i not in declined]
    assert result.columnar == task_events(kept) + task_events(odd)


def test_a_small_body_takes_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_batch, "COLUMNAR_MIN_BYTES", 32 * 1024)
    result = assert_same_as_careful(body_of(clean(generated_events(9))))
    assert result is not None and result.columnar == 0


@pytest.mark.parametrize("body", [
    b'[{"eventId": "AAAA",}]',  # a trailing comma: DuckDB reads it, orjson does not
    b'[{"eventId": "AAAA"},]', b"\xef\xbb\xbf[]",
    b'[{"eventId": "AAAA", "eventType": "TASK_LIFECYCLE_EVENT", "x": NaN}]',
    b'[{"eventId": "AAAA", "eventType": "TASK_LIFECYCLE_EVENT", "x": 1e400}]',
    b'[{"eventId": "AAAA", "eventId": "AAAB"}]',  # a repeated key: orjson keeps the last
    b"[null]", b"[5]", b"[[]]", b"[]", b"{}", b'[{"a": "\\ud800"}]', b"[1, 2",
    b"", b" \n", b"[] []", b"[]x",
])
def test_json_only_duckdb_reads_is_refused_as_before(body: bytes) -> None:
    assert_same_as_careful(body)


def test_a_body_that_cannot_be_written_for_duckdb_takes_the_python_path(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A full tmpfs or the agent's file size limit (a full spool's test sets one) fails
    the body's file: the Python path, which writes none, maps the body instead."""
    state = json_columns._thread_state()
    monkeypatch.setattr(state, "path", str(tmp_path / "gone" / "body.json"))
    events = clean(generated_events(30))
    result = assert_same_as_careful(body_of(events))
    assert result is not None and result.columnar == 0 and result.batch.num_rows == 60


def test_odd_values_in_every_field_of_a_taken_event() -> None:
    base = clean(load("02_excerpt_task_lifecycle_normal_and_failed.json"))
    definition, owner, running = base[2], base[3], base[0]
    odd: list[dict[str, Any]] = []
    for event, payload_key in ((definition, "taskDefinitionEvent"),
                               (owner, "taskLifecycleEvent"), (running, "taskLifecycleEvent")):
        keys = [(None, k) for k in event] + [(payload_key, k) for k in event[payload_key]]
        for where, key in keys:
            for value in ODD_VALUES:
                changed = copy.deepcopy(event)
                changed["eventId"] = b64(len(odd).to_bytes(4, "big") * 7)  # not a repeat
                (changed if where is None else changed[payload_key])[key] = value
                odd.append(changed)
    result = assert_same_as_careful(body_of(odd))
    assert result is not None and result.columnar > len(odd) / 4  # the odd value is one field
    assert_same_as_careful(body_of(odd, spaced=True, ascii_only=False), STAMPS[1])


ODD_VALUES: list[Any] = [
    None, "", "0", 0, -1, 1.0, True, {}, [], "AAAA", "AA==", "AB==", "not base64!", "//8=",
    "2026-11-29T12:05:22Z", "2026-02-30T12:05:22Z", "2026-11-29T24:00:00Z",
    "1969-12-31T23:59:59.999999999Z", "2262-04-11T23:47:16.854775808Z", "é", "a\"b\\c",
    "\u0000", 2**31, -(2**31) - 1, 2**63, "12", {"errorType": "X"}, [{"state": "RUNNING"}],
]


# ---- Hypothesis over recorded bodies with odd shapes ---------------------------------------

SAMPLES = clean(all_samples())
TASK_SAMPLES = [e for e in SAMPLES if e.get("eventType") in TASK_TYPES]
TIMES = ["2026-11-29T12:05:22.487696773Z", "2026-11-29T12:05:22Z", "2026-11-29T12:05:22.5Z",
         "2026-11-29T12:05:22.123+02:00", "2026-11-29t12:05:22Z", "2026-02-29T00:00:00Z",
         "2024-02-29T23:59:59.999Z", "1970-01-01T00:00:00Z", "2261-12-31T23:59:59Z", "",
         "2026-11-29T12:05:60Z", "x"]
IDS = ["", "AA", "AAAA", "AA==", "AB==", "A===", "not base64!", "////", "ÿÿ", "\\u00e9",
       "Ho/20jYTJ4T///////////////8BAAAA", "AQAAAA==\n"]


def odd_shape(event: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """One of the shapes Ray might send, or a fuzzer would: a field dropped, an odd id or
    time, a field added, transitions out of order, unicode, a number as text."""
    event = copy.deepcopy(event)
    payload = next((v for k, v in event.items() if k.endswith("Event") and isinstance(v, dict)),
                   event)
    target = data.draw(st.sampled_from([event, payload]))
    change = data.draw(st.integers(0, 7))
    keys = sorted(target)
    if change == 0 and keys:
        target.pop(data.draw(st.sampled_from(keys)))
    elif change == 1:
        key = data.draw(st.sampled_from(["eventId", "nodeId", "taskId", "jobId", "workerId",
                                         "parentTaskId", "actorId", "placementGroupId"]))
        (event if key in ("eventId", "nodeId") else payload)[key] = data.draw(
            st.sampled_from(IDS) | json_value)
    elif change == 2:
        target[data.draw(st.sampled_from(["newField", "rayFuture", "x", "state"]))] = \
            data.draw(json_value)
    elif change == 3:
        steps = payload.get("stateTransitions")
        if isinstance(steps, list) and steps:
            payload["stateTransitions"] = data.draw(st.permutations(steps))
            payload["stateTransitions"][0]["timestamp"] = data.draw(st.sampled_from(TIMES))
    elif change == 4:
        event["timestamp"] = data.draw(st.sampled_from(TIMES) | json_value)
    elif change == 5:
        key = data.draw(st.sampled_from(["sessionName", "severity", "message"]))
        event[key] = data.draw(st.text(max_size=6) | json_value)
    elif change == 6:
        key = data.draw(st.sampled_from(["taskAttempt", "workerPid"]))
        payload[key] = data.draw(st.sampled_from(["1", 1.0, -0, 0, 2**31, 7, "x"]))
    else:
        event = mutated(event, data)  # at times not an object at all
    return event


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_odd_shaped_bodies_give_the_careful_rows(data: st.DataObject) -> None:
    events = data.draw(st.lists(st.sampled_from(TASK_SAMPLES + SAMPLES), min_size=1,
                                max_size=8))
    events = [odd_shape(e, data) if data.draw(st.booleans()) else e for e in events]
    if data.draw(st.booleans()):  # duplicates, as a resend inside one body
        events.append(data.draw(st.sampled_from(events)))
    body = body_of(events, data.draw(st.booleans()), data.draw(st.booleans()))
    assert_same_as_careful(body, data.draw(st.sampled_from(STAMPS)))


def test_the_columnar_checks_see_a_field_ray_adds_by_the_event_s_length() -> None:
    """A field the reader has no column for would be dropped: the length says it is there."""
    events = clean(generated_events(6))
    events[1]["taskLifecycleEvent"]["stateTransitions"][0]["newField"] = "x"
    events[3]["taskDefinitionEvent"]["newField"] = 0  # at its default: the attrs skip it
    events[4]["taskLifecycleEvent"]["rayErrorInfo"] = {}  # no error: taken
    result = assert_same_as_careful(body_of(events))
    assert result is not None and result.columnar == 4


def test_ids_decode_at_once_as_binascii_does() -> None:
    values = pa.array(['"AB=="', '"AQ=="', None, '""', '"//8A"'])
    found, ok = json_values.hex_ids(values)
    assert found.to_pylist() == ["00", "01", None, None, "ffff00"] and ok.all()
