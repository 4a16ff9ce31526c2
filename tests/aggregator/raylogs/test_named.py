"""Which files a batch of rows names: the Arrow pick of the rows that can name one gives
what a look at every row gives, over Ray's recorded payloads, made-up log names and rows
of other producers beside them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.ray.batch import ray_items_to_batch
from aggregator.raylogs.named import files_named_by_rows, named_in
from tests.aggregator.ray.samples import all_samples
from tests.aggregator.raylogs.rayevents import running_event

STAMP = Stamp(1_700_000_000_000_000_000, None, None, "agent-node", "agent-host")


def test_ray_payloads_and_other_rows_name_the_same_files_either_way() -> None:
    items: list[Any] = [*all_samples(),
                        running_event("aa" * 24, "/tmp/ray/s/logs/a.out", "/tmp/ray/s/logs/a.err"),
                        running_event("bb" * 24, "relative.out", "/tmp/ray/s/logs/b.txt")]
    ray = ray_items_to_batch(list(enumerate(items)), STAMP).batch
    others = rows_to_batch([
        {"kind": "worker", "source": "emitter", "worker_id": "w1", "attrs": {"worker_pid": "5"}},
        {"kind": "task", "name": "plain"},
        {"kind": "actor", "source": "ray", "worker_id": "w2", "attrs": {"worker_pid": "7"}},
        {"kind": "actor", "source": "ray", "worker_id": "w3"},
    ], STAMP).batch
    for batch in (ray, others, pa.concat_batches([others, ray])):
        found = named_in(batch)
        assert found == files_named_by_rows(batch)  # every row looked at
    assert any(f.path == "/tmp/ray/s/logs/a.out" for f in named_in(ray))
    assert any(f.worker is not None for f in named_in(ray))  # the recorded workers
    assert [f.worker for f in named_in(others)] == [("w2", 7)]
