"""What the Ray room's differential tests share: the stamps they map with, a batch as
plain rows, and Hypothesis' odd values and mutations of real events (as in
test_ray_batch.py, whose own copies its tests keep)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from aggregator.decode.normalize import Stamp

STAMPS = [Stamp(1_700_000_000_123_456_789, None, None, "agent-node", "agent-host"),
          Stamp(1_700_000_000_000_000_001, 7, 1000, "", "")]


def plain(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows with timestamps as integer ns (to_pylist cannot make datetimes of them)."""
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in batch.columns]
    rows: list[dict[str, Any]] = pa.RecordBatch.from_arrays(
        columns, names=batch.schema.names).to_pylist()
    return rows


EDGE_VALUES = [None, "", "0", 0, -1, 1.5, True, False, {}, [], "FAILED", "RUNNING", "x",
               2**31, -(2**31) - 1, 2**63 - 1, "AAAA", "AA==", "not base64!", "//8=",
               "2026-11-29T12:05:22.487696773Z", "2026-11-29T12:05:22Z", "1900-01-01T00:00:00Z",
               "9999-12-31T23:59:59.999999999Z", {"a": 1}, ["b"], {"errorType": "X"}]
json_leaf = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
             | st.sampled_from(EDGE_VALUES))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


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
