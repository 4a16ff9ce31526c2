"""The column-wise JSON encoder against a plain row-by-row reference, and batch cutting."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from sinks.http.batches import PendingRows, frame_body, gzip_body, idempotency_key
from sinks.http.body import CHUNK_ROWS, PAD_LIMIT, encode_rows
from sinks.schema import EVENT_SCHEMA

T0 = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123456789Z


def reference(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """What each row must decode to: times RFC 3339, non-finite floats null, absent values
    left out (including a float that was NaN: null at the top level is "absent")."""
    columns: dict[str, list[Any]] = {}
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            columns[field.name] = [None if v is None else rfc3339(v)
                                   for v in column.cast(pa.int64()).to_pylist()]
        elif pa.types.is_map(field.type):
            columns[field.name] = [None if v is None else {k: finite(x) for k, x in v}
                                   for v in column.to_pylist()]
        else:
            columns[field.name] = [finite(v) for v in column.to_pylist()]
    # Column by column, as Python values: a scalar per cell made the 16k-row case slow.
    return [{name: values[i] for name, values in columns.items() if values[i] is not None}
            for i in range(batch.num_rows)]


def finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def rfc3339(nanos: int) -> str:
    seconds, fraction = divmod(nanos, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{fraction:09d}Z"


def decoded(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    chunks = encode_rows(batch)
    data = b"".join(bytes(c.data) for c in chunks)
    assert data.count(b"\n") == batch.num_rows and (not data or data.endswith(b"\n"))
    for chunk in chunks:
        assert int(chunk.ends[-1]) == len(chunk.data)
        assert all(chunk.data[int(e) - 1] == ord("\n") for e in chunk.ends)
    rows = [orjson.loads(line) for line in data.split(b"\n")[:-1]]
    array = orjson.loads(frame_body([c.data for c in chunks], "json"))
    assert array == rows
    # An absent value is either left out or written as null (the fixed-width path).
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


def batch_of(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=EVENT_SCHEMA)


def varied(n: int) -> list[dict[str, Any]]:
    tricky = ['say "hi"', "back\\slash", "line\nbreak\ttab", "bell\x01\x1f", "é ☃ 🚀",
              '{,"x":1}', "", "\u2028"]
    return [{
        "event_id": f"id-{i:06d}", "time": T0 + i * 1_000_003, "kind": "task",
        "source": ("ray", "torch", "otel")[i % 3], "name": tricky[i % len(tricky)],
        "state": None if i % 4 == 0 else ("RUNNING", "FINISHED")[i % 2],
        "attempt": i % 3, "pid": 7, "step": None if i % 5 == 0 else i * pow(10, i, 10**12) % 10**12,
        "duration_s": (1e300, -0.0, 5e-324, math.nan, math.inf, 0.1 * i)[i % 6],
        "error_message": ("x" * (i * 13 % 4099) if i % 7 == 0 else None),  # up to 4 KiB
        "metrics": ({"loss": i / 3, "lr": 1e-4} if i % 3 else {"acc": -1.5}),
        "nonfinite": (["a", 'q"'] if i % 2 else None),
        "attrs": ({} if i % 9 == 0 else {"rank": str(i % 8), "k\"ey": "v\\al"}),
        "received": T0 - 10**18 + i,  # 1994 and a negative-free fraction
    } for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 37, 500])
def test_varied_rows_decode_to_the_reference(n: int) -> None:
    batch = batch_of(varied(n))
    assert decoded(batch) == reference(batch)


def test_uniform_rows_take_the_fixed_width_path_and_still_match() -> None:
    rows = [{"event_id": f"{i:036d}", "time": T0 + i, "kind": ("op", "task")[i % 2],
             "name": 'c"onst', "step": i % 100, "duration_s": i / 8,
             "metrics": {"loss": i / 9, "lr": 0.5}, "attrs": {"model": "llama", "rank": str(i)},
             "received": T0} for i in range(300)]
    batch = batch_of(rows)
    assert decoded(batch) == reference(batch)
    line = bytes(encode_rows(batch)[0].data).split(b"\n")[1]
    assert b'"kind":"task",' in line  # the close quote precedes the padding


def test_rows_with_no_complete_column_still_form_objects() -> None:
    rows = [{"kind": None if i % 2 else "k" * (i % 40 + PAD_LIMIT * 2),
             "name": "n" * (i % 50 + PAD_LIMIT * 2) if i % 2 else None} for i in range(20)]
    rows.append({})
    batch = batch_of(rows)
    assert decoded(batch) == reference(batch)
    assert reference(batch)[-1] == {}


def test_times_before_1970_and_sliced_arrays() -> None:
    rows = [{"kind": "k", "time": -1_500_000_000 + i, "metrics": {"m": float(i)}}
            for i in range(10)]
    batch = batch_of(rows).slice(3, 5)
    assert decoded(batch) == reference(batch)
    assert decoded(batch)[0]["time"] == "1969-12-31T23:59:58.500000003Z"


def test_large_inputs_are_encoded_in_chunks() -> None:
    batch = batch_of(varied(CHUNK_ROWS + 10))
    chunks = encode_rows(pa.Table.from_batches([batch]))
    assert [len(c) for c in chunks] == [CHUNK_ROWS, 10]
    assert decoded(batch) == reference(batch)


def test_empty_input_encodes_to_nothing() -> None:
    assert encode_rows(batch_of([])) == []
    assert frame_body([], "json") == b"[]" and frame_body([], "ndjson") == b""


def test_gzip_body_is_a_gzip_member() -> None:
    import gzip

    assert gzip.decompress(gzip_body(b"abc" * 1000)) == b"abc" * 1000


def pending_with(records: list[tuple[int, int]], row_bytes: int = 20) -> PendingRows:
    """Records given as (offset, rows); every row `row_bytes` long."""
    batch = batch_of([{"kind": "x" * (row_bytes - 12)} for _, n in records for _ in range(n)])
    offsets = np.repeat([o for o, _ in records], [n for _, n in records]).astype(np.int64)
    pending = PendingRows()
    pending.add(encode_rows(batch), offsets, now=0.0)
    return pending


def test_pending_rows_are_cut_by_count_bytes_and_stop() -> None:
    pending = pending_with([(1, 3), (2, 4), (4, 2)])
    assert (len(pending), pending.size, pending.since) == (9, 180, 0.0)
    by_count = pending.take(2, 1000)
    assert (by_count.first, by_count.last, by_count.events) == ((1, 0), (1, 1), 2)
    assert not by_count.ends_record and not by_count.whole_records
    by_bytes = pending.take(100, 70)
    assert (by_bytes.first, by_bytes.last, by_bytes.events) == ((1, 2), (2, 1), 3)
    to_stop = pending.take(100, 1, stop=(4, 1))
    assert (to_stop.first, to_stop.last, to_stop.events) == ((2, 2), (4, 0), 3)
    assert pending.reaches((4, 2)) and not pending.reaches((4, 3))
    rest = pending.take(100, 1)  # at least one row even over the byte limit
    assert (rest.last, rest.events, rest.ends_record, len(pending), pending.since) == (
        (4, 1), 1, True, 0, None)


def test_idempotency_keys_name_records_or_row_positions() -> None:
    whole = idempotency_key("s", "spool", (1, 0), (5, 9), whole_records=True)
    assert whole == idempotency_key("s", "spool", (1, 0), (5, 3), whole_records=True)
    assert whole != idempotency_key("s", "spool", (1, 0), (5, 9), whole_records=False)
    assert whole != idempotency_key("t", "spool", (1, 0), (5, 9), whole_records=True)
    assert whole != idempotency_key("s", "other", (1, 0), (5, 9), whole_records=True)
    assert len(whole) == 32 and int(whole, 16) >= 0


def test_a_batch_too_large_splits_in_halves_by_events_in_either_format() -> None:
    import orjson

    from sinks.http.batches import Batch, frame_body
    from sinks.http.halves import split_batch

    rows = [orjson.dumps({"event_id": str(n), "attrs": {"a,b": "x\\ny"}}) + b"\n"
            for n in range(5)]
    for body_format in ("ndjson", "json"):
        batch = Batch("k" * 32, (0, 0), (1, 0), 0, 5, frame_body([b"".join(rows)],
                      body_format), False, False)
        halves = split_batch(batch, body_format)
        assert [h.events for h in halves] == [2, 3]
        assert len({h.key for h in halves} | {batch.key}) == 3
        assert [h.key for h in split_batch(batch, body_format)] == [h.key for h in halves]
        events = [e for h in halves for e in (
            orjson.loads(bytes(h.body)) if body_format == "json"
            else [orjson.loads(line) for line in bytes(h.body).splitlines()])]
        assert [e["event_id"] for e in events] == ["0", "1", "2", "3", "4"]
    one = Batch("k" * 32, (0, 0), (1, 0), 0, 1, rows[0], False, False)
    assert split_batch(one, "ndjson") == []
