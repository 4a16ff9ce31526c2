"""Many Ray task attempts written as the agent stores Ray 2.60's export, built with
numpy and pyarrow (no Python loop per row), for the timeline page and the State API
benchmark.

Each attempt is five rows, as one Ray attempt gives: the definition (state DEFINED,
the name, attrs ray_task_type, ray_function, ray_language), the owner's
PENDING_ARGS_AVAIL and SUBMITTED_TO_WORKER, the executor's RUNNING (with the
worker's pid) and the owner's FINISHED or FAILED (5%, TASK_EXECUTION_EXCEPTION), each
with Ray's state in attrs ray_state and the session in attrs ray_session. Plus one node
definition and ALIVE per node.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sinks.schema import EVENT_SCHEMA

SESSION = "session_2026-01-01_00-00-00_000000_1"
JOB = "01000000"
NODES = 8
WORKERS_PER_NODE = 16
T0_NS = int(np.datetime64("2026-01-01T00:00:00", "ns").astype(np.int64))
HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
NAMES = np.array([f"fn_{i:02d}" for i in range(20)], dtype=object)
ROW_STATES = np.array(["DEFINED", "PENDING", "SUBMITTED", "RUNNING", "END"], dtype=object)
RAY_STATES = np.array([None, "PENDING_ARGS_AVAIL", "SUBMITTED_TO_WORKER", "RUNNING", "END"],
                      dtype=object)


def hex_text(rng: np.random.Generator, n: int, nbytes: int) -> np.ndarray:
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    text = np.empty((n, nbytes * 2), dtype=np.uint8)
    text[:, 0::2] = HEX[raw >> 4]
    text[:, 1::2] = HEX[raw & 15]
    return text.view(f"S{nbytes * 2}").ravel().astype(str).astype(object)


def node_ids() -> np.ndarray:
    return np.array([f"{i:02x}" * 28 for i in range(1, NODES + 1)], dtype=object)


def worker_ids() -> np.ndarray:
    return np.array([f"{n:02x}{w:02x}" * 14 for n in range(1, NODES + 1)
                     for w in range(WORKERS_PER_NODE)], dtype=object)


def _attrs(which: np.ndarray, ray_state: np.ndarray, function: np.ndarray,
           pid: np.ndarray) -> pa.MapArray:
    """attrs per row: the definition's four keys, a lifecycle row's three (four with
    the executor's worker_pid), all with the session."""
    n = len(which)
    counts = np.where(which == 0, 5, np.where(which == 3, 4, 3))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    keys = np.empty(int(offsets[-1]), dtype=object)
    values = np.empty(int(offsets[-1]), dtype=object)
    start = offsets[:-1]
    session, event_type = "ray_session", "ray_event_type"
    defined = which == 0
    for slot, (key, value) in enumerate([(session, np.full(n, SESSION, dtype=object)),
                                         (event_type, np.where(defined, "TASK_DEFINITION_EVENT",
                                                               "TASK_LIFECYCLE_EVENT"))]):
        keys[start + slot] = key
        values[start + slot] = value
    keys[start[defined] + 2] = "ray_task_type"
    values[start[defined] + 2] = "NORMAL_TASK"
    keys[start[defined] + 3] = "ray_function"
    values[start[defined] + 3] = function[defined]
    keys[start[defined] + 4] = "ray_language"
    values[start[defined] + 4] = "PYTHON"
    life = ~defined
    keys[start[life] + 2] = "ray_state"
    values[start[life] + 2] = ray_state[life]
    running = which == 3
    keys[start[running] + 3] = "worker_pid"
    values[start[running] + 3] = pid[running].astype(str)
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()))


def task_table(rng: np.random.Generator, tasks: int, span_s: float) -> pa.Table:
    ids = hex_text(rng, tasks, 8) + ("ff" * 12 + JOB)
    workers, nodes = worker_ids(), node_ids()
    worker = rng.integers(0, len(workers), tasks)
    start = T0_NS + rng.integers(0, int(span_s * 1e9), tasks)
    run_ns = (rng.lognormal(-1.0, 1.0, tasks) * 1e9).astype(np.int64) + 1_000_000
    failed = rng.random(tasks) < 0.05
    n = tasks * 5
    which = np.tile(np.arange(5), tasks)
    task = np.repeat(np.arange(tasks), 5)
    offsets_ns = np.array([-3_000_000, -2_000_000, -1_000_000, 0, 0])
    times = start[task] + offsets_ns[which] + np.where(which == 4, run_ns[task], 0)
    end_state = np.where(failed[task], "FAILED", "FINISHED")
    state = np.where(which == 4, end_state, ROW_STATES[which]).astype(object)
    ray_state = np.where(which == 4, end_state, RAY_STATES[which]).astype(object)
    name = NAMES[task % len(NAMES)]
    function = ("bench." + name).astype(object)
    pid = 10_000 + worker[task]
    owner_side = (which == 1) | (which == 2) | (which == 4)
    error = (which == 4) & failed[task]
    cols = {
        "event_id": pa.array(hex_text(rng, n, 16)),
        "time": pa.array(times, pa.timestamp("ns", tz="UTC")),
        "kind": pa.array(np.full(n, "task", dtype=object)),
        "source": pa.array(np.full(n, "ray", dtype=object)),
        "name": pa.array(name, mask=which != 0),
        "state": pa.array(state),
        "task_id": pa.array(ids[task]), "attempt": pa.array(np.zeros(n, np.int32)),
        "parent_id": pa.array(np.full(n, "ff" * 20 + JOB, dtype=object), mask=which != 0),
        "job_id": pa.array(np.full(n, JOB, dtype=object)),
        "node_id": pa.array(nodes[worker[task] // WORKERS_PER_NODE]),
        "worker_id": pa.array(workers[worker[task]], mask=~owner_side),
        "error_type": pa.array(np.full(n, "TASK_EXECUTION_EXCEPTION", dtype=object),
                               mask=~error),
        "error_message": pa.array(np.full(n, "ValueError: generated failure", dtype=object),
                                  mask=~error),
        "attrs": _attrs(which, ray_state, function, pid),
        "received": pa.array(times + 5_000_000, pa.timestamp("ns", tz="UTC")),
    }
    return _full(cols, n).take(pa.array(rng.permutation(n)))  # out of order, as Ray posts


def node_table() -> pa.Table:
    nodes = node_ids()
    rows = []
    for i, node in enumerate(nodes):
        for state, event_type in (("DEFINED", "NODE_DEFINITION_EVENT"),
                                  ("ALIVE", "NODE_LIFECYCLE_EVENT")):
            attrs = {"ray_session": SESSION, "ray_event_type": event_type}
            if state == "DEFINED":
                attrs["ray_node_ip_address"] = f"10.0.0.{i + 1}"
            else:
                attrs["ray_resources"] = '{"CPU":16.0}' if i else \
                    '{"CPU":16.0,"node:__internal_head__":1.0}'
            rows.append({"event_id": f"node-{i}-{state}", "kind": "node", "source": "ray",
                         "state": state, "node_id": node, "time": T0_NS - 10**9,
                         "name": f"10.0.0.{i + 1}" if state == "DEFINED" else None,
                         "attrs": list(attrs.items()), "received": T0_NS - 10**9})
    cols = {f.name: [r.get(f.name) for r in rows] for f in EVENT_SCHEMA}
    return pa.Table.from_pydict(cols, schema=EVENT_SCHEMA)


def _full(cols: dict[str, pa.Array], n: int) -> pa.Table:
    arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type)
              for f in EVENT_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=EVENT_SCHEMA)


def write_ray_lake(root: Path, tasks: int, *, span_s: float = 3600.0, per_file: int = 200_000,
                   seed: int = 7) -> Path:
    """`tasks` attempts of one job in one session under `root`; returns root."""
    rng = np.random.default_rng(seed)
    part = root / "date=2026-01-01" / "hour=00" / "node=generated"
    part.mkdir(parents=True, exist_ok=True)
    pq.write_table(node_table(), part / "nodes.parquet")
    for index, first in enumerate(range(0, tasks, per_file)):
        table = task_table(rng, min(per_file, tasks - first), span_s)
        pq.write_table(table, part / f"tasks-{index:04d}.parquet", compression="zstd")
    return root
