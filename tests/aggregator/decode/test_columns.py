"""COLUMNS frames against NDJSON frames: the same emit()/op() calls give the same spool
batches, and hostile COLUMNS frames are refused whole with a reason, never a crash.

The calls are made with the real Op and the tuples emit() queues; each side is framed as
the sender frames it (emitters.outbox) and decoded by the agent's own decoders.
"""

from __future__ import annotations

import math
import struct
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aggregator.decode.columns import ColumnsRefused, decode_columns
from emitters import wire
from emitters.ops import Op
from emitters.snapshot import PLAIN, snapshot_fields
from tests.aggregator.decode.framing import STAMP, STAMPED, frames, spooled

# -- calls -------------------------------------------------------------------------------

texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "ü", "日本語", "a\x00b", "\ud800", "x\udfffy", "\U0001f600"]),
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
    st.booleans(), st.none(), st.just(-0.0))
values = st.one_of(texts, numbers, st.lists(st.integers(), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                   st.just("L" * 5000))
metrics = st.dictionaries(texts, numbers, max_size=5)
times = st.one_of(st.integers(-5, 2**63 + 5), st.just("2026-01-02T03:04:05.123456789Z"),
                  st.datetimes(timezones=st.just(UTC), min_value=datetime(1900, 1, 1)))
known = st.fixed_dictionaries({}, optional={
    "step": st.one_of(st.integers(-(2**64), 2**64), values),
    "attempt": st.one_of(st.integers(-(2**32), 2**32), values),
    "duration_s": st.one_of(st.floats(), values),
    "task_id": texts, "worker_id": st.one_of(texts, values), "host": texts,
    "event_id": texts, "time": times, "metrics": st.one_of(metrics, values),
    "nonfinite": st.one_of(st.lists(texts, max_size=3), values),
    "attrs": st.one_of(st.dictionaries(texts, values, max_size=4), values),
    "job_id": texts, "pid": st.integers(), "received": st.integers(),
    "error_message": texts,
})
unknown = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k.isidentifier()),
                          values, max_size=4)
emit_call = st.tuples(st.just("emit"), st.one_of(st.sampled_from(["task", "step", "op"]), texts),
                      st.one_of(st.none(), texts), st.one_of(st.none(), texts), known, unknown)
op_call = st.tuples(st.just("op"), texts, st.one_of(st.none(), st.integers(0, 10**6)),
                    metrics, st.booleans(), unknown)
calls = st.lists(st.one_of(emit_call, emit_call, op_call), min_size=1, max_size=40)


def queued(sequence: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The tuples emit() and op() would queue for these calls, in order."""
    items: list[tuple[Any, ...]] = []
    for call in sequence:
        if call[0] == "emit":
            _, kind, name, state, fields, extra = call
            fields = {**{k: v for k, v in extra.items() if k != "kind"}, **fields}
            if any(type(v) not in PLAIN for v in fields.values()):
                snapshot_fields(fields)
            items.append((time.time_ns(), kind, name, state, fields))
        else:
            _, name, step, op_metrics, fails, extra = call
            raises = pytest.raises(KeyError) if fails else _nothing()
            with raises, Op(items.append, name, step, dict(extra)) as op:
                op.metric(**{str(k): v for k, v in op_metrics.items()})
                if fails:
                    raise KeyError("boom")
    return items


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- both ways through the sender's framing and the agent's decoders -------------------

def assert_same_batches(ndjson: pa.Table, columns: pa.Table, items: list[tuple[Any, ...]]) -> None:
    assert ndjson.num_rows == columns.num_rows
    for name in ndjson.schema.names:
        if name in STAMPED or name == "event_id":
            continue
        assert ndjson.column(name).equals(columns.column(name)), (
            name, ndjson.column(name).to_pylist()[:5], columns.column(name).to_pylist()[:5])
    # ids the caller did not give are random on each side; the given ones are kept
    given = {item[4]["event_id"] for item in items
             if isinstance(item[4], dict) and isinstance(item[4].get("event_id"), str)}
    ndjson_ids = ndjson.column("event_id").to_pylist()
    columns_ids = columns.column("event_id").to_pylist()
    assert [i in given for i in ndjson_ids] == [i in given for i in columns_ids]
    assert [i for i in ndjson_ids if i in given] == [i for i in columns_ids if i in given]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls)
@example([("emit", "task", None, None, {"nonfinite": 1.0, "metrics": {}}, {})])  # refused
def test_the_same_calls_give_the_same_spool_batches(sequence: list[tuple[Any, ...]]) -> None:
    items = queued(sequence)
    ndjson, ndjson_rejected = spooled(frames(items, columns=False))
    columns, columns_rejected = spooled(frames(items, columns=True))
    assert ndjson_rejected == columns_rejected
    assert_same_batches(ndjson, columns, items)


def test_a_typical_frame_is_columns_and_smaller() -> None:
    items = queued([("emit", "step", "train", None, {"step": i, "metrics": {"loss": 0.5}},
                     {"lr": 0.1}) for i in range(500)])
    columnar, ndjson = frames(items, columns=True), frames(items, columns=False)
    assert [raw[5] for raw in columnar] == [wire.COLUMNS]
    assert len(columnar[0]) * 2 < len(ndjson[0])
    assert_same_batches(spooled(ndjson)[0], spooled(columnar)[0], items)


def test_small_frames_split_and_keep_every_event() -> None:
    items = queued([("emit", "task", f"n{i}", "RUNNING", {"task_id": "t" * (i % 50)}, {})
                    for i in range(3000)])
    columnar = frames(items, columns=True, max_frame=16 * 1024)
    assert len(columnar) > 3 and all(len(raw) <= 16 * 1024 for raw in columnar)
    assert_same_batches(spooled(frames(items, columns=False))[0], spooled(columnar)[0], items)


def test_text_times_and_rejected_events_go_as_ndjson() -> None:
    items = queued([("emit", "task", "a", None, {"time": "2026-01-02T03:04:05Z"}, {}),
                    ("emit", "", "no-kind", None, {}, {})])
    columnar = frames(items, columns=True)
    assert {raw[5] for raw in columnar} == {wire.BATCH}
    table, rejected = spooled(columnar)
    assert table.num_rows == 1 and rejected == 1


# -- hostile frames ---------------------------------------------------------------------

def good_payload(n: int = 20) -> tuple[bytes, int]:
    items = queued([("emit", "task", f"n{i}", None,
                     {"step": i, "metrics": {"a": 1.0, "b": float(i)}, "nonfinite": ["z"]},
                     {"extra": "x" * i}) for i in range(n)])
    raw = frames(items, columns=True)[0]
    frame = wire.decode_body(raw[4:])
    assert isinstance(frame, wire.Columns)
    return frame.payload, frame.count


def refused(payload: bytes, count: int) -> str:
    with pytest.raises(ColumnsRefused) as caught:
        decode_columns(payload, count, STAMP)
    return str(caught.value)


def table_entry(name: str, kind: str, rows: int, lengths: list[int]) -> bytes:
    return (bytes([len(name)]) + name.encode() + bytes([len(kind)]) + kind.encode()
            + struct.pack(">IB", rows, len(lengths)) + b"".join(struct.pack(">I", n)
                                                                 for n in lengths))


def handmade(entries: list[bytes], buffers: list[bytes]) -> bytes:
    head = struct.pack(">H", len(entries)) + b"".join(entries)
    out = head + bytes(-(30 + len(head)) % 8)
    for part in buffers:
        out += part + bytes(-len(part) % 8)
    return out


SOME_NS = 1_765_000_000_123_456_789  # 2025-12-06
TIME_1 = table_entry("time", "timestamp_ns", 1, [0, 8])
KIND_1 = table_entry("kind", "string", 1, [0, 8, 4])
BUFFERS_1 = [b"", struct.pack("<q", SOME_NS), b"", struct.pack("<ii", 0, 4), b"task"]


def test_a_handmade_frame_decodes() -> None:
    batch = decode_columns(handmade([TIME_1, KIND_1], BUFFERS_1), 1, STAMP).batch
    assert batch.column("kind").to_pylist() == ["task"]
    assert batch.column("pid").to_pylist() == [4242]
    assert batch.column("node_id").to_pylist() == ["node-a"]


HOSTILE = {
    "length past the frame": ([TIME_1, table_entry("kind", "string", 1, [0, 8, 400])],
                              BUFFERS_1, "'kind'"),
    "offsets backwards": ([TIME_1, KIND_1], [b"", struct.pack("<q", SOME_NS), b"",
                                             struct.pack("<ii", 0, -4), b"task"], "'kind'"),
    "offsets past the data": ([TIME_1, table_entry("kind", "string", 1, [0, 8, 4])],
                              [b"", struct.pack("<q", SOME_NS), b"", struct.pack("<ii", 0, 9),
                               b"task"], "'kind'"),
    "invalid UTF-8": ([TIME_1, KIND_1], [b"", struct.pack("<q", SOME_NS), b"",
                                         struct.pack("<ii", 0, 4), b"t\xffsk"], "UTF8"),
    "no such type": ([TIME_1, table_entry("kind", "strung", 1, [0, 8, 4])], BUFFERS_1,
                     "no such type 'strung'"),
    "wrong type": ([TIME_1, table_entry("kind", "int64", 1, [0, 8])], BUFFERS_1[:3],
                   "the event schema says string"),
    "no such column": ([TIME_1, KIND_1, table_entry("colour", "string", 1, [0, 8, 0])],
                       [*BUFFERS_1, b"", struct.pack("<ii", 0, 0), b""], "no such column"),
    "a stamped column": ([TIME_1, KIND_1, table_entry("pid", "int32", 1, [0, 4])],
                         [*BUFFERS_1, b"", b"\0\0\0\0"], "stamped by the agent"),
    "no kind": ([TIME_1], BUFFERS_1[:2], "'kind': missing"),
    "wrong buffer count": ([TIME_1, table_entry("kind", "string", 1, [0, 8])], BUFFERS_1[:4],
                           "buffers"),
    "empty kind": ([TIME_1, table_entry("kind", "string", 1, [0, 8, 0])],
                   [b"", struct.pack("<q", SOME_NS), b"", struct.pack("<ii", 0, 0), b""], "kind"),
    "a key twice in one event": (
        [TIME_1, KIND_1, table_entry("metrics", "map_string_float64", 1, [0, 8, 12, 2, 16])],
        [*BUFFERS_1, b"", struct.pack("<ii", 0, 2), struct.pack("<iii", 0, 1, 2), b"aa",
         struct.pack("<dd", 1.0, 2.0)], "'metrics': a key twice"),
    "a NaN metric": (
        [TIME_1, KIND_1, table_entry("metrics", "map_string_float64", 1, [0, 8, 8, 1, 8])],
        [*BUFFERS_1, b"", struct.pack("<ii", 0, 1), struct.pack("<ii", 0, 1), b"a",
         struct.pack("<d", math.nan)], "not finite"),
    "a negative duration": (
        [TIME_1, KIND_1, table_entry("duration_s", "float64", 1, [0, 8])],
        [*BUFFERS_1, b"", struct.pack("<d", -5.0)], "'duration_s': a negative value"),
    "negative time": ([TIME_1, KIND_1], [b"", struct.pack("<q", -5), *BUFFERS_1[2:]],
                      "before 1973"),
    "a time in seconds": ([TIME_1, KIND_1], [b"", struct.pack("<q", 1_765_000_000),
                                             *BUFFERS_1[2:]],
                          "a time before 1973: integer times are nanoseconds since 1970"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_frames_are_refused_with_a_reason(case: str) -> None:
    entries, buffers, reason = HOSTILE[case]
    assert reason in refused(handmade(entries, buffers), 1)


def test_a_count_that_disagrees_with_the_buffers_is_refused() -> None:
    payload, count = good_payload()
    assert "'time'" in refused(payload, count + 1)
    assert "'time'" in refused(payload, count - 1)


def test_a_huge_declared_count_allocates_nothing() -> None:
    pool = pa.default_memory_pool()
    before = pool.max_memory()
    payload = handmade([table_entry("time", "timestamp_ns", 2**32 - 1, [0, 8]), KIND_1],
                       BUFFERS_1)
    assert "'time'" in refused(payload, 2**32 - 1)
    assert pool.max_memory() - before <= len(payload)


def test_constants_may_not_blow_a_frame_up() -> None:
    long_kind = "k" * 60_000
    entry = table_entry("kind", "string", 1, [0, 8, len(long_kind)])
    payload = handmade([table_entry("time", "timestamp_ns", 1000, [0, 8000]), entry],
                       [b"", bytes(8000), b"", struct.pack("<ii", 0, len(long_kind)),
                        long_kind.encode()])
    assert "times" in refused(payload, 1000)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_frames_decode_or_are_refused(data: st.DataObject) -> None:
    payload, count = good_payload()
    raw = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    if cut is not None:
        raw = raw[:cut]
    count = data.draw(st.sampled_from([count, count, 0, 1, count * 2, 2**32 - 1]))
    try:
        batch = decode_columns(bytes(raw), count, STAMP).batch
    except ColumnsRefused as exc:
        assert str(exc).startswith("COLUMNS frame refused: ")
        return
    batch.validate(full=True)
    assert batch.num_rows == count
    assert all(math.isfinite(v) for v in batch.column("duration_s").drop_null().to_pylist())


def test_each_reason_names_the_frame_type() -> None:
    payload, count = good_payload()
    assert refused(payload[:10], count).startswith("COLUMNS frame refused")
    assert Counter(decode_columns(payload, count, STAMP).batch.column("kind").to_pylist()) == {
        "task": count}
