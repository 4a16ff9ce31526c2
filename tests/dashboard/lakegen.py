"""A small evagg store with known answers, written as the Parquet sink lays it out.

`write_sample_store(root)` writes the same events every time (except event ids where
none is fixed): Ray-like task events split across files and out of order, a training
run's ops with steps, one OpenTelemetry trace, agent heartbeats and loss reports, and
duplicates of a few events in a second file. `Expected` holds the answers.
"""

from __future__ import annotations

import datetime as dt
import io
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.schema import EVENT_SCHEMA

T0 = dt.datetime(2025, 3, 1, 10, 0, 0, tzinfo=dt.UTC)
Row = dict[str, Any]


def at(seconds: float) -> int:
    """T0 + seconds, as integer nanoseconds."""
    return int(T0.timestamp() * 1e9) + round(seconds * 1e9)


def event(**fields: Any) -> Row:
    row: Row = {"event_id": str(uuid.uuid4()), "received": fields.get("time", at(0)) + 1000}
    row.update(fields)
    return row


def table_of(rows: Iterable[Row]) -> pa.Table:
    rows = list(rows)
    columns = {f.name: [r.get(f.name) for r in rows] for f in EVENT_SCHEMA}
    return pa.Table.from_pydict(columns, schema=EVENT_SCHEMA)


def partition_of(row: Row) -> str:
    moment = dt.datetime.fromtimestamp(row["time"] / 1e9, tz=dt.UTC)
    node = row.get("node_id") or "unknown"
    return f"date={moment:%Y-%m-%d}/hour={moment:%H}/node={node}"


Put = Callable[[str, bytes], None]


def local_put(root: Path) -> Put:
    def put(relative: str, data: bytes) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return put


def write_rows(put: Put, rows: Iterable[Row], file_name: str) -> list[str]:
    """Write rows into one file per Hive partition; returns the relative paths."""
    by_partition: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_partition[partition_of(row)].append(row)
    written = []
    for partition, part_rows in sorted(by_partition.items()):
        buffer = io.BytesIO()
        pq.write_table(table_of(part_rows), buffer, compression="zstd")
        relative = f"{partition}/{file_name}"
        put(relative, buffer.getvalue())
        written.append(relative)
    return written


# -- the sample ----------------------------------------------------------------------

def task_events(task_id: str, name: str, *, attempt: int = 0, start: float, run_s: float | None,
                end_state: str | None, node: str = "nodeA", job: str = "job1",
                error: tuple[str, str, str] | None = None, pid: int = 100) -> list[Row]:
    """Ray-style pieces of one attempt, as aggregator/ray/events.py maps them: the
    definition (state DEFINED, the only piece with the name), the owner's lifecycle
    events and the executor's RUNNING (its pid in attrs, as Ray reports it)."""
    common = {"kind": "task", "source": "ray", "task_id": task_id, "attempt": attempt,
              "job_id": job}
    rows = [
        event(**common, name=name, state="DEFINED", time=at(start),
              attrs={"ray_event_type": "TASK_DEFINITION_EVENT"}),
        event(**common, state="PENDING", time=at(start), node_id=node,
              attrs={"ray_event_type": "TASK_LIFECYCLE_EVENT"}),
        event(**common, state="SUBMITTED", time=at(start + 0.1), node_id=node,
              attrs={"ray_event_type": "TASK_LIFECYCLE_EVENT"}),
    ]
    if run_s is None:
        return rows
    rows.append(event(**common, state="RUNNING", time=at(start + 0.2), node_id=node,
                      worker_id=f"w-{task_id}",
                      attrs={"ray_event_type": "TASK_LIFECYCLE_EVENT",
                             "worker_pid": str(pid)}))
    if end_state is not None:
        err = dict(zip(("error_type", "error_message", "stack_trace"), error or (), strict=False))
        rows.append(event(**common, state=end_state, time=at(start + 0.2 + run_s),
                          node_id=node, worker_id=f"w-{task_id}", duration_s=run_s,
                          attrs={"ray_event_type": "TASK_LIFECYCLE_EVENT"}, **err))
    return rows


BOOM_STACK = ('Traceback (most recent call last):\n  File "job.py", line 12, in boom\n'
              '    raise ValueError("bad shard 7")\nValueError: bad shard 7')


def sample_tasks() -> list[list[Row]]:
    """One list of rows per task attempt."""
    tasks = [task_events(f"sq{i:02d}", "square", start=i * 10.0, run_s=float(i),
                         end_state="FINISHED", node="nodeA" if i % 2 else "nodeB", pid=200 + i)
             for i in range(1, 11)]
    tasks += [
        task_events("boom1", "boom", start=5.0, run_s=0.5, end_state="FAILED", job="job2",
                    error=("ValueError", "bad shard 7", BOOM_STACK)),
        task_events("boom2", "boom", start=6.0, run_s=1.5, end_state="FAILED", job="job2",
                    error=("ValueError", "bad shard 9", BOOM_STACK.replace("7", "9"))),
        task_events("boom3", "boom", start=7.0, run_s=4.0, end_state="FAILED", job="job2",
                    error=("TimeoutError", "deadline exceeded", "Traceback: wait_for timed out")),
        task_events("flaky", "flaky", attempt=0, start=20.0, run_s=1.0, end_state="FAILED",
                    error=("OSError", "disk full", "Traceback: write failed ENOSPC")),
        task_events("flaky", "flaky", attempt=1, start=22.0, run_s=2.0, end_state="FINISHED"),
        task_events("slow1", "slow", start=30.0, run_s=100.0, end_state=None),
        task_events("wait1", "waiting", start=40.0, run_s=None, end_state=None),
    ]
    return tasks


def op(name: str, step: int | None, start: float, seconds: float, *, state: str = "FINISHED",
       metrics: dict[str, float] | None = None, run: str = "run1") -> list[Row]:
    span = uuid.uuid4().hex[:16]
    common = {"kind": "op", "source": "torch", "name": name, "run_id": run, "step": step,
              "span_id": span, "node_id": "nodeA", "job_id": "train"}
    end: Row = event(**common, state=state, time=at(start + seconds), duration_s=seconds,
                     metrics=metrics)
    if state == "FAILED":
        end.update(error_type="RuntimeError", error_message="CUDA error: misaligned address")
    return [event(**common, state="STARTED", time=at(start)), end]


def sample_ops() -> list[Row]:
    rows = op("load_checkpoint", None, 100.0, 2.0)
    for step in range(3):
        base = 110.0 + step * 10
        losses = [0.9, 0.7] if step == 1 else [1.0 - 0.2 * step]
        for index, loss in enumerate(losses):
            rows += op("forward", step, base + index, 0.5, metrics={"loss": loss})
        rows += op("backward", step, base + 3, 1.0, state="FAILED" if step == 2 else "FINISHED",
                   metrics={"grad_norm": 2.0 + step})
        rows += op("optimizer.step", step, base + 5, 0.25)
    rows += op("eval", 3, 150.0, 3.0, metrics={"loss": 0.5})  # beyond the last optimizer step
    rows += op("save", None, 160.0, 4.0)  # after the last optimizer step, no step
    rows += op("forward", 0, 200.0, 0.5, metrics={"loss": 2.0}, run="run2")
    return rows


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def sample_spans() -> list[Row]:
    def span(name: str, span_id: str, parent: str | None, start: float, seconds: float,
             state: str = "FINISHED") -> Row:
        row = event(kind="span", source="otel", name=name, trace_id=TRACE, span_id=span_id,
                    parent_span_id=parent, time=at(300 + start), duration_s=seconds, state=state,
                    node_id="nodeA", attrs={"service.name": "api", "otel.span_kind": "INTERNAL"})
        if state == "FAILED":
            row.update(error_type="TemplateError", error_message="missing variable 'user'",
                       stack_trace="Traceback (most recent call last):\n  File \"page.py\", "
                                   "line 9, in render\nTemplateError: missing variable 'user'")
        return row

    return [
        span("request", "a000000000000001", None, 0.0, 1.0),
        span("db.query", "a000000000000002", "a000000000000001", 0.1, 0.3),
        span("render", "a000000000000003", "a000000000000001", 0.5, 0.4),
        span("template", "a000000000000004", "a000000000000003", 0.6, 0.1, state="FAILED"),
    ]


def sample_agents() -> list[Row]:
    def beat(node: str, t: float, received: float, delivered: float) -> Row:
        metrics = {'evagg_received_events_total{route="socket"}': received * 0.75,
                   'evagg_received_events_total{route="http"}': received * 0.25,
                   'evagg_delivered_events_total{sink="lake"}': delivered,
                   "evagg_spool_bytes": 4096.0}
        return event(kind="agent", source="evagg", name="heartbeat", state="RUNNING",
                     node_id=node, time=at(t), metrics=metrics, attrs={"version": "0.1.0"})

    def loss(node: str, t: float, reason: str, events: float) -> Row:
        return event(kind="loss", source="evagg", name=reason, state="DROPPED", node_id=node,
                     time=at(t), metrics={"events": events}, attrs={"reason": reason})

    return [
        beat("nodeA", 0, 100, 90), beat("nodeA", 10, 200, 190), beat("nodeA", 20, 400, 380),
        beat("nodeB", 15, 50, 50),
        loss("nodeA", 12, "spool_full", 5), loss("nodeA", 18, "spool_full", 3),
    ]


class Expected:
    tasks = 17  # task attempts: 10 square, 3 boom, 2 flaky, 1 slow, 1 waiting
    by_state: ClassVar[dict[str, int]] = {"FINISHED": 11, "FAILED": 4, "RUNNING": 1, "SUBMITTED": 1}
    square_quantiles = (5.5, 9.1, 9.91, 10.0)  # p50, p90, p99, max of 1..10 s
    errors: ClassVar[dict[str, int]] = {"ValueError": 2, "TimeoutError": 1, "OSError": 1}
    distinct_events: int = 0  # filled in by write_sample_store
    raw_rows: int = 0
    # run1: step -> ops (the load joins step 0; eval and the final save join step 2)
    steps: ClassVar[dict[int, int]] = {0: 4, 1: 4, 2: 5}
    step_failures: ClassVar[dict[int, int]] = {0: 0, 1: 0, 2: 1}
    step1_loss = (0.7, 0.9, 0.8)  # min, max, mean
    spans = 4
    agents_received_per_s = 20.0  # nodeA: (400 - 200) / 10 s
    lost_events_node_a = 8.0


def write_sample_store(put: Put) -> type[Expected]:
    """Write the sample in four files per partition; duplicates land in the last one."""
    tasks = sample_tasks()
    definitions = [t[0] for t in tasks]
    owner = [r for t in tasks for r in t[1:] if r["state"] != "RUNNING"]
    executor = [r for t in tasks for r in t[1:] if r["state"] == "RUNNING"]
    ops, spans, agents = sample_ops(), sample_spans(), sample_agents()
    duplicates = [owner[-1], ops[3], spans[0], agents[0], executor[0]]
    # Out of order: the owner's terminal events land before the executor's RUNNING and
    # before the definitions that carry the names.
    write_rows(put, owner + spans, "part-00001.parquet")
    write_rows(put, executor + ops, "part-00002.parquet")
    write_rows(put, definitions + agents, "part-00003.parquet")
    write_rows(put, duplicates, "part-00004.parquet")
    Expected.distinct_events = len(owner + spans + executor + ops + definitions + agents)
    Expected.raw_rows = Expected.distinct_events + len(duplicates)
    return Expected
