"""Queue time across a hand-off and the request ledger: real processes, a real agent,
Parquet read back through DuckDB and the dashboard's views."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

from dashboard.lake.errors import BadInput
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions import ledger
from emitters import queueing
from emitters.emitter import Emitter
from emitters.tracecontext import span
from tests.agentproc import REPO, AgentProcess, query_lake
from tests.emitters.fakeagent import FakeAgent, short_socket_path
from tests.emitters.integrations.queue_requests import scripted_run, wait_for_rows

# The consumer: another process that gets meta as JSON and does the work.
CONSUMER = r"""
import json, sys
from emitters import queueing
from emitters.emitter import Emitter
emitter = Emitter(socket=sys.argv[1], run_id="consumer-own-run")
with queueing.start_work(json.loads(sys.argv[2]), name="train", emitter=emitter) as op:
    op.metric(tokens=128)
assert emitter.flush(30)
"""


@pytest.fixture
def fake() -> Iterator[FakeAgent]:
    with FakeAgent(short_socket_path()) as agent:
        yield agent


def test_event_shape_of_a_request_answered_in_process(fake: FakeAgent) -> None:
    emitter = Emitter(socket=str(fake.path), run_id="run-1")
    with span() as producer:
        meta = queueing.enqueue({}, request_id="req-1", name="generate", emitter=emitter,
                                user="alice")
    assert meta[queueing.REQUEST_ID] == "req-1" and meta[queueing.RUN_ID] == "run-1"
    assert json.loads(json.dumps(meta)) == meta  # it can travel as JSON
    with queueing.start_work(meta, emitter=emitter) as op:
        op.metric(tokens=3)
    assert emitter.flush(10)
    events = fake.events()
    requests = [e for e in events if e["kind"] == "request"]
    assert [e["state"] for e in requests] == ["ENQUEUED", "STARTED", "ANSWERED"]
    assert {e["task_id"] for e in requests} == {"req-1"}
    assert {e["run_id"] for e in events} == {"run-1"}
    assert requests[0]["time"] == meta[queueing.ENQUEUED_NS]
    assert requests[0]["attrs"] == {"user": "alice"}
    assert producer.context is not None
    assert requests[0]["trace_id"] == producer.context.trace_id
    ops = [e for e in events if e["kind"] == "op"]
    assert [e["state"] for e in ops] == ["STARTED", "FINISHED"]
    assert all(e["name"] == "generate" and e["attrs"]["request_id"] == "req-1" for e in ops)
    assert ops[0]["parent_span_id"] == producer.context.span_id
    assert ops[1]["metrics"]["tokens"] == 3.0
    queue_s = requests[1]["metrics"]["queue_s"]
    assert ops[0]["metrics"]["queue_s"] == ops[1]["metrics"]["queue_s"] == queue_s
    answered = requests[2]["metrics"]
    assert answered["latency_s"] >= answered["queue_s"] == queue_s
    assert requests[2]["duration_s"] >= 0


def test_a_failure_is_recorded_and_the_exception_reaches_the_caller(fake: FakeAgent) -> None:
    emitter = Emitter(socket=str(fake.path))
    meta = queueing.enqueue(None, name="job", emitter=emitter)
    with pytest.raises(KeyError, match="shard-9"), queueing.start_work(meta, emitter=emitter):
        raise KeyError("shard-9")
    assert emitter.flush(10)
    failed = [e for e in fake.events() if e["state"] == "FAILED"]
    assert {e["kind"] for e in failed} == {"request", "op"}
    assert all(e["error_type"] == "KeyError" and "shard-9" in e["stack_trace"] for e in failed)
    assert len(meta[queueing.REQUEST_ID]) == 16  # an id was made up


def test_meta_without_a_stamp_records_only_the_op(fake: FakeAgent) -> None:
    emitter = Emitter(socket=str(fake.path))
    for meta in ({}, None, {queueing.ENQUEUED_NS: "soon", queueing.REQUEST_ID: 7}, "junk"):
        with queueing.start_work(meta, name="w", emitter=emitter):  # type: ignore[arg-type]
            pass
    assert emitter.flush(10)
    events = fake.events()
    assert {e["kind"] for e in events} == {"op"} and len(events) == 8
    assert all("queue_s" not in e.get("metrics", {}) for e in events)


def test_async_with(fake: FakeAgent) -> None:
    emitter = Emitter(socket=str(fake.path))
    meta = queueing.enqueue({}, request_id="a-1", emitter=emitter)

    async def consume() -> None:
        async with queueing.start_work(meta, name="serve", emitter=emitter) as op:
            op.metric(items=2)

    asyncio.run(consume())
    assert emitter.flush(10)
    assert [e["state"] for e in fake.events() if e["kind"] == "request"] == [
        "ENQUEUED", "STARTED", "ANSWERED"]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with AgentProcess(tmp_path_factory.mktemp("queueing")) as running:
        yield running


def test_work_run_two_seconds_after_enqueue_carries_queue_s_of_about_two(
        agent: AgentProcess) -> None:
    producer = Emitter(socket=str(agent.socket_path), run_id="handoff")
    enqueued = time.monotonic()
    meta = queueing.enqueue({}, request_id="slow-1", name="train", emitter=producer)
    assert producer.flush(10)
    time.sleep(2.0)
    subprocess.run([sys.executable, "-c", CONSUMER, str(agent.socket_path), json.dumps(meta)],
                   cwd=REPO, check=True, timeout=60,
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    waited = time.monotonic() - enqueued  # the most the queue time can be, however slow
    wait_for_rows(agent, "kind IN ('op', 'request') AND run_id = 'handoff'", 5)
    ops = query_lake(agent.lake_dir, "SELECT state, metrics['queue_s'], run_id FROM events "
                                     "WHERE kind = 'op' AND attrs['request_id'] = 'slow-1'")
    assert sorted(state for state, _, _ in ops) == ["FINISHED", "STARTED"]
    for _, queue_s, run_id in ops:
        assert 1.95 <= queue_s <= waited + 0.05
        assert run_id == "handoff"  # the producer's run, not the consumer's own
    started = query_lake(agent.lake_dir, "SELECT metrics['queue_s'] FROM events WHERE "
                                         "kind = 'request' AND state = 'STARTED' AND "
                                         "task_id = 'slow-1'")  # this request's only
    assert [value for (value,) in started] == [ops[0][1]]


def test_the_ledger_counts_a_scripted_run(agent: AgentProcess) -> None:
    emitter = Emitter(socket=str(agent.socket_path), run_id="ledger-run")
    scripted_run(emitter)
    assert emitter.flush(10)
    wait_for_rows(agent, "run_id IN ('ledger-run', 'other-run')", 29)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{agent.lake_dir}/**/"
                "*.parquet', hive_partitioning = true)")
    [row] = ledger.ledger(con, "ledger-run", 0)
    assert {k: row[k] for k in ("requests", "enqueued", "started", "answered", "failed",
                                "waiting", "running", "outstanding", "failed_attempts")} == {
        "requests": 6, "enqueued": 6, "started": 5, "answered": 3, "failed": 1,
        "waiting": 1, "running": 1, "outstanding": 2, "failed_attempts": 2}
    assert row["outstanding_ids"] == ["q4", "q5"]
    assert ledger.ledger(con, "ledger-run", 3600)[0]["outstanding"] == 0
    late = ledger.ledger(con, "ledger-run", 3600,
                         now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))
    assert late[0]["outstanding_ids"] == ["q4", "q5"]
    rows = ledger.outstanding(con, "ledger-run", 0)
    assert [(r["request_id"], r["state"]) for r in rows] == [("q4", "STARTED"),
                                                             ("q5", "ENQUEUED")]
    assert all(r["age_s"] >= 0 for r in rows)
    assert ledger.ledger(con, "other-run", 0)[0]["outstanding_ids"] == ["q0"]
    assert ledger.ledger(con, "no-such-run", 0) == []
    # The same through the dashboard's Store, where ledger.sql loads with the other views.
    store = Store(StoreOptions(str(agent.lake_dir), refresh_s=0.0))
    try:
        result = store.execute(*ledger.summary_query("ledger-run", 0))
        assert result.records()[0]["answered"] == 3
        states = dict(store.execute("SELECT request_id, state FROM requests "
                                    "WHERE run_id = 'ledger-run'").rows)
        assert states == {"q0": "ANSWERED", "q1": "ANSWERED", "q2": "FAILED",
                          "q3": "ANSWERED", "q4": "STARTED", "q5": "ENQUEUED"}
    finally:
        store.close()


@pytest.mark.parametrize("args", [
    (7, 0), ("run", -1), ("run", float("nan")), ("run", True), ("run\x00", 0)])
def test_ledger_refuses_bad_input(args: tuple[Any, Any]) -> None:
    with pytest.raises(BadInput):
        ledger.summary_query(*args)


def test_ledger_refuses_a_naive_time_and_a_bad_limit() -> None:
    with pytest.raises(BadInput):
        ledger.summary_query("run", 0, now=dt.datetime(2025, 1, 1))
    with pytest.raises(BadInput):
        ledger.outstanding_query("run", 0, limit=0)


def test_ledger_sql_is_a_view_file_of_the_dashboard() -> None:
    assert (REPO / "dashboard" / "sql" / "ledger.sql").read_text() == ledger.view_sql()
