"""Requests through emitters.queueing as the ledger tests record them: a scripted run with
every ending a request can have, and a wait for their rows in an agent's lake."""

from __future__ import annotations

import contextvars
import time

import pytest

from emitters import queueing
from emitters.emitter import Emitter
from tests.agentproc import AgentProcess, query_lake


def wait_for_rows(agent: AgentProcess, where: str, count: int, timeout: float = 60) -> None:
    """Until the lake holds `count` rows matching `where` (the sink rolls every second)."""
    deadline = time.monotonic() + timeout
    sql = f"SELECT count(*) FROM events WHERE {where}"
    while True:
        found = query_lake(agent.lake_dir, sql)[0][0] if list(agent.lake_dir.rglob(
            "*.parquet")) else 0
        if found >= count:
            assert found == count, f"{found} rows where {where}, expected {count}"
            return
        assert time.monotonic() < deadline, f"{found} of {count} rows where {where}"
        time.sleep(0.2)


def scripted_run(emitter: Emitter) -> None:
    """q0, q1 answered; q2 fails; q3 fails, then a retry answers; q4 starts and never
    ends; q5 is never picked up. Another run has one request of its own."""
    metas = [queueing.enqueue({}, request_id=f"q{i}", name="infer", emitter=emitter)
             for i in range(6)]
    for meta in metas[:2]:
        with queueing.start_work(meta, emitter=emitter):
            pass
    for meta in (metas[2], metas[3]):
        with pytest.raises(RuntimeError), queueing.start_work(meta, emitter=emitter):
            raise RuntimeError("out of memory")
    with queueing.start_work(metas[3], emitter=emitter):
        pass
    # a consumer that died inside its work; in a copied context so its trace context
    # does not stay attached in this test process
    contextvars.copy_context().run(queueing.start_work(metas[4], emitter=emitter).__enter__)
    queueing.enqueue({}, request_id="q0", name="infer", run_id="other-run", emitter=emitter)
