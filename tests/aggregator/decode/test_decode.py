"""The bulk NDJSON decoder against the careful path it must agree with."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import hypothesis
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aggregator.decode.ndjson import (
    BulkRefused,
    decode_bulk,
    decode_careful,
    decode_ndjson,
    fallback_counts,
    sort_map_entries,
)
from aggregator.decode.normalize import Stamp
from emitters.fields import EARLIEST_TIME_NS, EVENT_FIELDS, KINDS
from sinks.schema import EVENT_SCHEMA

STAMP = Stamp(
    received_ns=1_750_000_000_123_456_789, pid=4242, uid=1000, node_id="node-a", host="gpu-1"
)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
DURATION = st.floats(min_value=0, allow_nan=False, allow_infinity=False)  # never negative
TEXT = st.text(max_size=12)
STRING_FIELDS = [
    n for n, t in EVENT_FIELDS.items() if t == "string" and n not in ("event_id", "kind")
]
UNKNOWN_KEYS = st.text(max_size=8).filter(lambda k: k not in EVENT_FIELDS)
ISO_TEXT = st.datetimes().map(lambda d: d.isoformat())  # the reader would infer timestamps
# Times that fit int64 nanoseconds (the careful path does not range-check RFC 3339 text yet).
RFC3339 = st.datetimes(datetime(1970, 1, 1), datetime(2262, 1, 1)).map(
    lambda d: d.isoformat() + "Z"
)


def ndjson(events: list[Any]) -> bytes:
    return b"".join(orjson.dumps(e) + b"\n" for e in events)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(_ABSENT), strategy)


_ABSENT = object()


@st.composite
def emitter_event(draw: st.DrawFn) -> dict[str, Any]:
    """What our emitter writes, plus unknown top-level fields from other producers."""
    event: dict[str, Any] = {
        "event_id": str(draw(st.uuids())),
        "kind": draw(st.sampled_from(KINDS) | st.text(min_size=1, max_size=8)),
        "time": draw(optional(st.integers(EARLIEST_TIME_NS, 2**63 - 1))),
        "attempt": draw(optional(INT32)),
        "step": draw(optional(INT64)),
        "duration_s": draw(optional(DURATION)),
        "metrics": draw(optional(st.dictionaries(TEXT, FINITE | INT64, max_size=4))),
        "nonfinite": draw(optional(st.lists(TEXT, max_size=3))),
        "attrs": draw(optional(st.dictionaries(TEXT, TEXT | ISO_TEXT, max_size=4))),
    }
    for name in draw(st.lists(st.sampled_from(STRING_FIELDS), max_size=6, unique=True)):
        event[name] = draw(TEXT)
    for name in draw(st.lists(UNKNOWN_KEYS, max_size=3)):
        event[name] = draw(unknown_field_value(name))
    return {k: v for k, v in event.items() if v is not _ABSENT}


def unknown_field_value(name: str) -> st.SearchStrategy[Any]:
    """One JSON type per unknown key, as one producer would keep it."""
    return [TEXT | ISO_TEXT, INT64, st.booleans()][len(name) % 3]


def assert_same(bulk: pa.RecordBatch, careful: pa.RecordBatch, *, random_ids: bool = False) -> None:
    """Column by column; `random_ids` when the input has no event ids (both paths draw them)."""
    assert bulk.schema.equals(EVENT_SCHEMA)
    assert careful.schema.equals(EVENT_SCHEMA)
    for name in EVENT_SCHEMA.names:
        if random_ids and name == "event_id":
            assert bulk.column(name).null_count == careful.column(name).null_count == 0
            continue
        assert bulk.column(name).equals(careful.column(name)), name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(emitter_event(), min_size=1, max_size=12))
def test_bulk_path_takes_emitter_events_and_matches_careful_path(
    events: list[dict[str, Any]],
) -> None:
    assert_bulk_matches_careful(events)


def assert_bulk_matches_careful(events: list[dict[str, Any]]) -> None:
    """Events our emitter could send: the bulk path takes them and agrees with the
    careful path column for column."""
    payload = ndjson(events)
    # Varying metric keys plus a "null" somewhere is ambiguous to the bulk path by design.
    assume(b"null" not in payload)
    careful = decode_careful(payload, STAMP)
    assert careful.rejected == []
    assert_same(decode_bulk(payload, STAMP), careful.batch)


def messy_value() -> st.SearchStrategy[Any]:
    scalar = st.none() | st.booleans() | INT64 | st.integers(2**63, 2**64 - 1) | FINITE | TEXT
    return st.recursive(
        scalar,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(TEXT, inner, max_size=2),
        max_leaves=4,
    )


@st.composite
def messy_line(draw: st.DrawFn) -> bytes:
    """Lines other producers send: wrong types, nulls, nesting, broken JSON, odd layout.

    Most lines are clean, so that many frames still take the bulk path."""
    choice = draw(st.integers(0, 19))
    if choice == 0:
        return draw(st.sampled_from(GARBAGE_LINES))
    event = draw(emitter_event())
    if choice > 4:
        return orjson.dumps(event)
    event["event_id"] = draw(st.just(event["event_id"]) | INT64)  # never missing: ids are random
    fields = st.sampled_from(sorted(set(EVENT_FIELDS) - {"event_id"}))
    for name in draw(st.lists(fields, max_size=2)):
        event[name] = draw(messy_value())
    if choice == 1:
        metric = st.none() | FINITE | INT64 | TEXT
        event["metrics"] = draw(st.dictionaries(TEXT, metric, max_size=3))
    elif choice == 2:
        event["attrs"] = draw(st.dictionaries(TEXT, messy_value(), max_size=3))
    elif choice == 3:
        event["time"] = draw(RFC3339 | st.integers(-5, 5))
    event.update(draw(st.dictionaries(UNKNOWN_KEYS, messy_value(), max_size=2)))
    return orjson.dumps(event)


GARBAGE_LINES = [
    b"not json",
    b"[1, 2]",
    b"5",
    b'{"kind": "a"} {"kind": "b"}',
    b"",
    b"   ",
    b'{"kind": "a", "duration_s": NaN}',
    b'{"kind": "\xff"}',
    b'{"event_id": "e-cr", "kind": "a"}\r',
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messy_line(), min_size=1, max_size=8), st.sampled_from([b"\n", b"\r\n"]))
def test_any_input_decodes_as_the_careful_path_does(lines: list[bytes], newline: bytes) -> None:
    payload = newline.join(lines) + newline
    careful = decode_careful(payload, STAMP)
    result = decode_ndjson(payload, STAMP)
    assert result.rejected == careful.rejected
    assert_same(result.batch, careful.batch)
    try:
        bulk = decode_bulk(payload, STAMP)
    except BulkRefused as refused:
        hypothesis.event(f"careful path: {refused.reason}")
        return
    except pa.ArrowInvalid:
        hypothesis.event("careful path: arrow_invalid")
        return
    hypothesis.event("bulk path")
    assert careful.rejected == []
    assert_same(bulk, careful.batch)


def test_producer_cannot_claim_pid_uid_or_received() -> None:
    payload = ndjson([{"kind": "op", "pid": 1, "uid": 0, "received": 5}, {"kind": "op", "pid": 7}])
    batch = decode_bulk(payload, STAMP)
    assert batch.column("pid").to_pylist() == [4242, 4242]
    assert batch.column("uid").to_pylist() == [1000, 1000]
    assert batch.column("received").cast(pa.int64()).to_pylist() == [STAMP.received_ns] * 2
    assert batch.column("attrs").to_pylist() == [None, None]
    http_stamp = Stamp(received_ns=STAMP.received_ns)
    assert decode_ndjson(payload, http_stamp).batch.column("pid").to_pylist() == [None, None]


def test_bad_lines_are_rejected_with_reasons_and_good_lines_kept() -> None:
    payload = b"\n".join(
        [
            b'{"kind": "op", "name": "ok-1"}',
            b"not json",
            b'{"kind": "op", "name": 5}',
            b'{"name": "no kind"}',
            b'{"kind": "op", "name": "ok-2", "attempt": 1.5}',
            b'{"kind": "op", "name": "ok-3"}',
        ]
    )
    result = decode_ndjson(payload, STAMP)
    assert result.batch.column("name").to_pylist() == ["ok-1", "ok-3"]
    reasons = dict(result.rejected)
    assert sorted(reasons) == [1, 2, 3, 4]
    assert reasons[1].startswith("invalid JSON")
    assert "'name' must be a string" in reasons[2]
    assert "'kind' is required" in reasons[3]
    assert "'attempt' must be an integer" in reasons[4]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"kind": "a", "x": 1}\n{"kind": "b", "x": "one"}\n', "arrow_invalid"),
        (
            b'{"kind": "a", "metrics": {"loss": null}}\n{"kind": "b", "metrics": {"lr": 1}}\n',
            "null_in_object",
        ),
        (b'{"kind": "a", "attrs": {"nested": {"b": 2, "a": 1}}}\n', "attr_type"),
        (b'{"kind": "a", "ratio": 0.5}\n', "attr_type"),
        (b'{"kind": "a", "metrics": {"loss": "high"}}\n', "metric_type"),
        (b'{"kind": "a", "duration_s": Infinity}\n', "duration_nonfinite"),
        (b'{"kind": "a", "duration_s": -5}\n', "duration_negative"),
        (b'{"kind": "a", "nonfinite": ["x", null]}\n', "nonfinite_null"),
        (b'{"kind": "", "name": "empty kind"}\n', "kind_missing"),
        (b'{"kind": "a", "time": -1}\n', "time_range"),
        (b'{"kind": "a"}\n\n{"kind": "b"}\n', "layout"),
        (b'{"kind": "a"} {"kind": "b"}\n', "line_count"),
        (b'{"kind": "caf\xc3"}\n', "utf8"),
        (b'[{"kind": "a"}]', "layout"),
    ],
)
def test_refused_frames_go_to_the_careful_path(payload: bytes, reason: str) -> None:
    with pytest.raises((BulkRefused, pa.ArrowInvalid)) as refused:
        decode_bulk(payload, STAMP)
    got = refused.value.reason if isinstance(refused.value, BulkRefused) else "arrow_invalid"
    assert got == reason
    before = fallback_counts().get(reason, 0)
    result = decode_ndjson(payload, STAMP)
    assert fallback_counts()[reason] == before + 1
    careful = decode_careful(payload, STAMP)
    assert result.rejected == careful.rejected
    assert_same(result.batch, careful.batch, random_ids=True)


def test_fallback_keeps_what_bulk_cannot_express() -> None:
    payload = (
        b'{"kind": "a", "x": 1, "attrs": {"nested": {"b": 2, "a": 1}},'
        b' "metrics": {"loss": null, "lr": 0.1}}\n'
        b'{"kind": "b", "x": "one", "ratio": 0.5}\n'
    )
    batch = decode_ndjson(payload, STAMP).batch
    assert batch.column("attrs").to_pylist() == [
        [("nested", '{"a":1,"b":2}'), ("x", "1")],
        [("ratio", "0.5"), ("x", "one")],
    ]
    assert batch.column("metrics").to_pylist() == [[("lr", 0.1)], None]
    assert batch.column("nonfinite").to_pylist() == [["loss"], None]


def test_unknown_fields_fold_into_attrs_and_explicit_attrs_win() -> None:
    payload = ndjson(
        [
            {"kind": "a", "zone": "eu", "gpu": 3, "spot": True, "attrs": {"zone": "us", "b": "x"}},
            {"kind": "b", "started": "2024-05-01T10:00:00Z"},
            {"kind": "c", "attrs": {}},
        ]
    )
    batch = decode_bulk(payload, STAMP)
    assert batch.column("attrs").to_pylist() == [
        [("b", "x"), ("gpu", "3"), ("spot", "true"), ("zone", "us")],
        [("started", "2024-05-01T10:00:00Z")],
        None,
    ]


def test_missing_fields_take_defaults_from_the_stamp() -> None:
    payload = ndjson(
        [{"kind": "a"},
         {"kind": "b", "node_id": "other", "host": "", "time": 10**18, "event_id": "e-1"}]
    )
    batch = decode_bulk(payload, STAMP)
    ids = batch.column("event_id").to_pylist()
    assert uuid.UUID(ids[0]).version == 7
    assert ids[1] == "e-1"
    assert batch.column("time").cast(pa.int64()).to_pylist() == [STAMP.received_ns, 10**18]
    assert batch.column("node_id").to_pylist() == ["node-a", "other"]
    assert batch.column("host").to_pylist() == ["gpu-1", ""]
    no_node = decode_bulk(payload, Stamp(received_ns=1))
    assert no_node.column("node_id").to_pylist() == [None, "other"]


def test_metrics_become_a_sorted_map_of_floats() -> None:
    payload = ndjson(
        [
            {"kind": "a", "metrics": {"lr": 1, "loss": 0.5}},
            {"kind": "b", "metrics": {}},
            {"kind": "c"},
        ]
    )
    batch = decode_bulk(payload, STAMP)
    assert batch.column("metrics").to_pylist() == [[("loss", 0.5), ("lr", 1.0)], [], None]


def test_empty_and_array_payloads() -> None:
    assert decode_ndjson(b"", STAMP).accepted == 0
    result = decode_ndjson(b'[{"kind": "a"}, {"name": "x"}]', STAMP)
    assert result.accepted == 1
    assert result.rejected == [(1, "field 'kind' is required")]


def test_sort_map_entries_orders_each_row_and_keeps_nulls() -> None:
    maps = pa.array(
        [[("b", 1.0), ("a", 2.0)], None, [], [("z", 0.0), ("c", 1.0), ("m", 2.0)]],
        EVENT_SCHEMA.field("metrics").type,
    )
    assert sort_map_entries(maps.slice(1)).to_pylist() == [
        None,
        [],
        [("c", 1.0), ("m", 2.0), ("z", 0.0)],
    ]
    assert sort_map_entries(maps).to_pylist()[0] == [("a", 2.0), ("b", 1.0)]


@st.composite
def uniform_frame(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Events that all carry the same metric names (the dense metrics case), known string
    fields that may look like timestamps, and whole-number durations."""
    names = draw(st.lists(TEXT, min_size=1, max_size=4, unique=True))
    events = []
    for _ in range(draw(st.integers(1, 10))):
        event = draw(emitter_event())
        event["metrics"] = {name: draw(FINITE | INT64) for name in names}
        for field in draw(st.lists(st.sampled_from(STRING_FIELDS), max_size=3, unique=True)):
            event[field] = draw(TEXT | ISO_TEXT)
        event["duration_s"] = draw(st.integers(0, 2**64 - 1) | DURATION)
        events.append(event)
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uniform_frame())
def test_uniform_frames_take_the_bulk_path_and_match_careful_path(
    events: list[dict[str, Any]],
) -> None:
    assert_bulk_matches_careful(events)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"kind": "a", "name": 5}\n', "field_type"),
        (b'{"kind": "a", "step": 1.5}\n{"kind": "b", "step": 2}\n', "field_type"),
        (b'{"kind": "a", "time": "2024-05-01T10:00:00Z"}\n', "field_type"),
        (b'{"kind": "a", "time": 9223372036854775808}\n', "field_type"),
        (b'{"kind": "a", "nonfinite": [1]}\n', "field_type"),
        (b'{"kind": "a", "attempt": 2147483648}\n', "int_range"),
        (b'{"kind": "a", "metrics": {"loss": NaN}}\n', "metric_nonfinite"),
        (b'{"kind": "a", "metrics": {"loss": true}}\n', "metric_type"),
    ],
)
def test_inferred_types_the_careful_path_rejects_are_refused(payload: bytes, reason: str) -> None:
    with pytest.raises(BulkRefused) as refused:
        decode_bulk(payload, STAMP)
    assert refused.value.reason == reason
    result = decode_ndjson(payload, STAMP)
    careful = decode_careful(payload, STAMP)
    assert result.rejected == careful.rejected
    assert_same(result.batch, careful.batch, random_ids=True)


def test_inferred_types_that_hold_the_same_values_are_kept() -> None:
    payload = ndjson(
        [
            {"kind": "a", "name": "2024-05-01", "attempt": 3, "duration_s": 2, "nonfinite": []},
            {"kind": "b", "name": "2024-05-02 10:00:00", "duration_s": 2**63, "time": 10**18},
        ]
    )
    batch = decode_bulk(payload, STAMP)
    assert batch.column("name").to_pylist() == ["2024-05-01", "2024-05-02 10:00:00"]
    assert batch.column("attempt").type == pa.int32()
    assert batch.column("attempt").to_pylist() == [3, None]
    assert batch.column("duration_s").to_pylist() == [2.0, float(2**63)]
    assert batch.column("nonfinite").to_pylist() == [[], None]
    assert_same(batch, decode_careful(payload, STAMP).batch, random_ids=True)


def test_every_row_with_every_metric_gives_sorted_maps() -> None:
    payload = ndjson(
        [
            {"kind": "a", "metrics": {"tokens": 4096, "loss": 0.5, "lr": 1e-4}},
            {"kind": "b", "metrics": {"lr": 2e-4, "tokens": 1, "loss": 0.25}},
        ]
    )
    batch = decode_bulk(payload, STAMP)
    assert batch.column("metrics").to_pylist() == [
        [("loss", 0.5), ("lr", 1e-4), ("tokens", 4096.0)],
        [("loss", 0.25), ("lr", 2e-4), ("tokens", 1.0)],
    ]
    assert_same(batch, decode_careful(payload, STAMP).batch, random_ids=True)


def test_absent_node_and_time_take_stamp_values_for_the_whole_frame() -> None:
    payload = ndjson([{"kind": "a"}, {"kind": "b"}, {"kind": "c", "host": "h"}])
    batch = decode_bulk(payload, STAMP)
    assert batch.column("node_id").to_pylist() == ["node-a"] * 3
    assert batch.column("host").to_pylist() == ["gpu-1", "gpu-1", "h"]
    assert batch.column("time").cast(pa.int64()).to_pylist() == [STAMP.received_ns] * 3
