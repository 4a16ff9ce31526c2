"""The query layer over Parquet that a real agent wrote: a local directory and moto S3.

Each agent gets the same small set of events through its real ingest paths (the Unix
socket emitter, POST /v1/events, POST /v1/traces, POST /ray/events), split over frames and
requests and out of order, and is then stopped: the store outlives it. The views
(dashboard.lake.store.Store) and one `evagg query` subprocess must read back exactly what
was sent.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from dashboard.questions import queries
from emitters import Emitter
from emitters.ids import new_event_id
from tests.agentproc import REPO, AgentProcess
from tests.dashboard.httpfs import needs_httpfs
from tests.sinks.moto_server import MotoS3, aws_env

BASE_NS = 1_750_000_000 * 10**9  # 2025-06-15T15:06:40Z: fixed task and span times
SECOND = 10**9
RUN = "run-a"
JOB = "job-7"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT_SPAN, CHILD_SPAN, OTLP_SPAN = "00f067aa0ba902b7", "00f067aa0ba902b8", "00f067aa0ba902b9"
RAY_EXCERPT = REPO / "tests/fixtures/ray/02_excerpt_task_lifecycle_normal_and_failed.json"
RAY_SQUARE = "1e8ff6d236132784ffffffffffffffffffffffff01000000"
RAY_BOOM = "239c2f70c73fbf73ffffffffffffffffffffffff01000000"
STACK = 'Traceback (most recent call last):\n  File "load.py", line 3\nValueError: bad shard 9'
NATIVE_EVENTS = 11 + 14 + 3  # task events (one more resent), op events, native span events
RAY_ROWS = 12  # the excerpt's events as rows (one per state transition)
S3_BUCKET = "evagg-agent-store"


@dataclass(frozen=True)
class Lake:
    """Where a stopped agent left its Parquet, and how to read it."""

    location: str
    endpoint_url: str | None
    exit_code: int
    engine: str = "auto"  # S3: httpfs, or "pyarrow" for the fallback reader

    def store(self, fold: bool = True) -> Store:
        return Store(StoreOptions(self.location, endpoint_url=self.endpoint_url,
                                  engine=self.engine, refresh_s=0.0, fold=fold))


# -- feeding a real agent ------------------------------------------------------------------


def task(task_id: str, state: str, at_s: float, attempt: int = 0, **fields: Any
         ) -> dict[str, Any]:
    return {"kind": "task", "name": task_id.split("-")[0], "task_id": task_id,
            "attempt": attempt, "state": state, "time": BASE_NS + int(at_s * SECOND),
            "job_id": JOB, **fields}


def emit_all(emitter: Emitter, events: list[dict[str, Any]]) -> None:
    for event in events:
        fields = dict(event)
        emitter.emit(fields.pop("kind"), fields.pop("name", None), fields.pop("state", None),
                     **fields)
    assert emitter.flush(10.0), emitter.stats()  # acked: in the agent's spool


def post(url: str, body: bytes, content_type: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
        text = answer.read()
    return dict(json.loads(text)) if text.strip() else {}


def feed_tasks(agent: AgentProcess, emitter: Emitter) -> None:
    """Finished before running, across frames and routes; a resent event; a retry."""
    ok_finished = task("ok-1", "FINISHED", 3.0, duration_s=2.0, event_id=new_event_id())
    emit_all(emitter, [ok_finished,
                       task("fail-1", "FAILED", 6.0, error_type="ValueError",
                            error_message="bad shard 9", stack_trace=STACK)])
    emit_all(emitter, [task("norun-1", "PENDING", 0.0),
                       task("norun-1", "FINISHED", 1.5, duration_s=1.5),
                       task("fail-1", "RUNNING", 7.0, attempt=1),
                       task("fail-1", "FINISHED", 8.0, attempt=1)])
    late = [task("ok-1", "PENDING", 0.0), task("ok-1", "RUNNING", 1.0),
            task("fail-1", "PENDING", 4.0), task("fail-1", "RUNNING", 5.0),
            task("fail-1", "PENDING", 6.5, attempt=1),
            ok_finished]  # the same event again: a resend must not count twice
    body = b"\n".join(json.dumps(event).encode() for event in late)
    answer = post(f"{agent.http_url}/v1/events", body, "application/x-ndjson")
    assert (answer["accepted"], answer["rejected"]) == (len(late), 0)


def feed_ops(emitter: Emitter) -> None:
    """Two optimizer steps, a failed backward, then an eval numbered past the last step
    and a save without a step: both trailing ops join step 2 (dashboard/sql/steps.sql)."""
    for step in (1, 2):
        with emitter.op("forward", step=step) as forward:
            forward.metric(loss=1.0 / step)
            time.sleep(0.02)  # a start the ops view must pair with its end
        if step == 2:
            with pytest.raises(RuntimeError), emitter.op("backward", step=step):
                raise RuntimeError("grad is nan")
        with emitter.op("optimizer.step", step=step):
            pass
    with emitter.op("eval", step=3) as evaluation:
        evaluation.metric(loss=0.4)
    with emitter.op("save_checkpoint"):
        pass
    assert emitter.flush(10.0), emitter.stats()


def feed_spans(agent: AgentProcess, emitter: Emitter) -> None:
    """A native root span (STARTED, then FINISHED in a later frame), a native child and an
    OTLP/HTTP child in the same trace."""
    root = {"trace_id": TRACE, "span_id": ROOT_SPAN}
    emit_all(emitter, [{"kind": "span", "name": "handle", "state": "STARTED",
                        "time": BASE_NS + 10 * SECOND, **root}])
    emit_all(emitter, [{"kind": "span", "name": "handle", "state": "FINISHED",
                        "time": BASE_NS + 11 * SECOND, "duration_s": 1.0, **root},
                       {"kind": "span", "name": "db.query", "state": "FINISHED",
                        "time": BASE_NS + 10 * SECOND + 10**8, "duration_s": 0.2,
                        "trace_id": TRACE, "span_id": CHILD_SPAN, "parent_span_id": ROOT_SPAN}])
    start = BASE_NS + 10 * SECOND + 5 * 10**8
    otlp = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": [{
            "traceId": TRACE, "spanId": OTLP_SPAN, "parentSpanId": ROOT_SPAN,
            "name": "render", "kind": 1, "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 3 * 10**8), "status": {}}]}]}]}
    post(f"{agent.http_url}/v1/traces", json.dumps(otlp).encode(), "application/json")


def feed_ray(agent: AgentProcess) -> None:
    """The captured excerpt, one POST per request body Ray sent, in arrival order."""
    events = json.loads(RAY_EXCERPT.read_text())["events"]
    rows = 0
    for _, group in itertools.groupby(events, key=lambda e: e["_captured_in"]):
        body = [{k: v for k, v in event.items() if k != "_captured_in"} for event in group]
        answer = post(f"{agent.http_url}/ray/events", json.dumps(body).encode(),
                      "application/json")
        assert answer["rejected"] == 0
        rows += answer["accepted"]
    assert rows == RAY_ROWS


def feed_and_stop(agent: AgentProcess) -> int:
    emitter = Emitter(socket=str(agent.socket_path), run_id=RUN, exit_timeout=5.0)
    try:
        feed_tasks(agent, emitter)
        feed_ops(emitter)
        feed_spans(agent, emitter)
    finally:
        emitter.close()
    feed_ray(agent)
    wait_for_heartbeat(agent)  # one written while running (the start's), besides the final one
    agent.wait_delivered(int(agent.metric("evagg_received_events_total")))
    return agent.stop()


def wait_for_heartbeat(agent: AgentProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while agent.metric('evagg_received_events_total{route="agent"}') < 1:
        assert time.monotonic() < deadline, agent.metrics()
        time.sleep(0.1)


@pytest.fixture(scope="module")
def local_lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    agent = AgentProcess(tmp_path_factory.mktemp("local-agent"))
    try:
        code = feed_and_stop(agent.start())
        yield Lake(str(agent.lake_dir), None, code)
    finally:
        agent.kill()
        shutil.rmtree(agent.socket_path.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_lake(tmp_path_factory: pytest.TempPathFactory, moto: MotoS3) -> Iterator[Lake]:
    bucket = moto.create_bucket(S3_BUCKET)
    sinks = ('[[sinks]]\nname = "lake"\ntype = "parquet"\n'
             f'url = "s3://{bucket}/cluster-1/"\nendpoint_url = "{moto.endpoint_url}"\n'
             'path_style = true\nroll_interval = "1s"\n')
    agent = AgentProcess(tmp_path_factory.mktemp("s3-agent"), sinks_toml=sinks, env=aws_env())
    try:
        code = feed_and_stop(agent.start())
        assert moto.keys(bucket, "cluster-1/") and moto.open_uploads(bucket) == []
        yield Lake(f"s3://{bucket}/cluster-1/", moto.endpoint_url, code)
    finally:
        agent.kill()
        shutil.rmtree(agent.socket_path.parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 store reads credentials through boto3's chain: moto's, nothing else."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture(params=["local", pytest.param("s3-httpfs", marks=needs_httpfs), "s3-pyarrow"])
def lake(request: pytest.FixtureRequest) -> Lake:
    where, _, engine = str(request.param).partition("-")
    found: Lake = request.getfixturevalue(f"{where}_lake")
    assert found.exit_code == 0
    return dataclasses.replace(found, engine=engine or "auto")


@pytest.fixture
def store(lake: Lake) -> Iterator[Store]:
    opened = lake.store()
    assert opened.engine == ("local" if lake.endpoint_url is None else lake.engine)
    yield opened
    opened.close()


# -- what the views say ----------------------------------------------------------------------

TASK_SQL = ("SELECT task_id, attempt, name, final_state, running_at IS NOT NULL AS ran, "
            "round(duration_s, 3) AS duration_s, error_type, error_message, stack_trace, "
            "events, source, node_id FROM tasks WHERE source = 'evagg' "
            "ORDER BY task_id, attempt")
NATIVE_TASKS = [
    ("fail-1", 0, "fail", "FAILED", True, 1.0, "ValueError", "bad shard 9", STACK, 3),
    ("fail-1", 1, "fail", "FINISHED", True, 1.0, None, None, None, 3),
    ("norun-1", 0, "norun", "FINISHED", False, 1.5, None, None, None, 2),
    ("ok-1", 0, "ok", "FINISHED", True, 2.0, None, None, None, 3),
]


def test_tasks_one_row_per_attempt(store: Store, lake: Lake) -> None:
    rows = store.execute(TASK_SQL).rows
    assert [tuple(r[:10]) for r in rows] == NATIVE_TASKS
    assert {(r[10], r[11]) for r in rows} == {("evagg", "test-node")}
    ray = store.execute(
        "SELECT task_id, name, final_state, error_type, error_message, ray_session IS NOT NULL "
        "FROM tasks WHERE source = 'ray' ORDER BY task_id").rows
    assert ray == [[RAY_SQUARE, "square", "FINISHED", None, None, True],
                   [RAY_BOOM, "boom", "FAILED", "TASK_EXECUTION_EXCEPTION",
                    "ValueError: intentional failure for x=7", True]]
    keys = store.execute("SELECT count(*), count(DISTINCT (task_id, attempt, ray_session)) "
                         "FROM tasks").rows
    assert keys == [[6, 6]]
    unfolded = lake.store(fold=False)  # tasks.sql over every raw event: the same rows
    try:
        assert unfolded.execute(TASK_SQL).rows == rows
    finally:
        unfolded.close()


def test_every_native_event_once(store: Store) -> None:
    # Events POSTed to /v1/events carry no source; the emitter's say "evagg".
    native = "kind IN ('task', 'op', 'span') AND coalesce(source, '') NOT IN ('ray', 'otel')"
    raw = store.execute(f"SELECT count(*) FROM events_raw WHERE {native}").rows[0][0]
    distinct = store.execute(f"SELECT count(*) FROM events WHERE {native}").rows[0][0]
    assert (raw, distinct) == (NATIVE_EVENTS + 1, NATIVE_EVENTS)  # the resend, kept once
    by_source = store.execute("SELECT source, count(*) FROM events "
                              "WHERE source IN ('ray', 'otel') GROUP BY 1 ORDER BY 1").rows
    assert by_source == [["otel", 1], ["ray", RAY_ROWS]]


def test_steps_with_the_trailing_save(store: Store) -> None:
    steps = queries.steps(store, RUN).records()
    assert [(s["step"], s["ops"], s["failures"], s["op_names"]) for s in steps] == [
        (1, 2, 0, ["forward", "optimizer.step"]),
        (2, 5, 1, ["backward", "eval", "forward", "optimizer.step", "save_checkpoint"]),
    ]
    assert steps[0]["metrics"]["loss"] == {"min": 1.0, "max": 1.0, "mean": 1.0}
    assert steps[1]["metrics"]["loss"]["min"] == pytest.approx(0.4)
    failed = store.execute("SELECT name, error_type, error_message, step FROM ops "
                           "WHERE state = 'FAILED'").rows
    assert failed == [["backward", "RuntimeError", "grad is nan", 2]]
    run = queries.runs(store).records()
    assert [(r["run_id"], r["steps"], r["ops"], r["failures"]) for r in run] == [(RUN, 2, 7, 1)]
    # STARTED and the end of each op fold into one row: its start is the STARTED event's
    spans = store.execute("SELECT name, step, epoch_us(time) - epoch_us(started_at) FROM ops "
                          "WHERE name = 'forward' ORDER BY step").rows
    assert [(n, s) for n, s, _ in spans] == [("forward", 1), ("forward", 2)]
    assert all(us >= 20_000 for _, _, us in spans)


def test_spans_share_the_trace(store: Store) -> None:
    spans = store.execute("SELECT span_id, parent_span_id, name, state, service, "
                          "round(duration_s, 3) FROM spans WHERE trace_id = $t ORDER BY span_id",
                          {"t": TRACE}).rows
    assert spans == [[ROOT_SPAN, None, "handle", "FINISHED", None, 1.0],
                     [CHILD_SPAN, ROOT_SPAN, "db.query", "FINISHED", None, 0.2],
                     [OTLP_SPAN, ROOT_SPAN, "render", "FINISHED", "api", 0.3]]
    trace = queries.traces(store).records()
    assert [(t["trace_id"], t["root_name"], t["spans"], t["failures"]) for t in trace] == [
        (TRACE, "handle", 3, 0)]


def test_agents_shows_the_heartbeats(store: Store) -> None:
    agents = queries.agents(store).records()
    assert len(agents) == 1
    agent = agents[0]
    assert (agent["node_id"], agent["state"], agent["lost_events"]) == ("test-node", "STOPPING", 0)
    assert agent["heartbeats"] >= 2  # at least one while running, then the final one
    assert agent["received_total"] >= NATIVE_EVENTS
    assert agent["delivered_total"] > 0


def test_query_summary_subprocess_matches_the_store(store: Store, lake: Lake) -> None:
    flags = ["--data", lake.location, "--no-cache", "--json"]
    if lake.endpoint_url:
        flags += ["--endpoint-url", lake.endpoint_url, "--engine", lake.engine]
    env = {**os.environ, **aws_env(), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "aggregator", "query", *flags, "summary"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = {(r["dimension"], r["value"]): r for r in json.loads(done.stdout)}
    total = summary[("all", None)]
    assert (total["tasks"], total["finished"], total["failed"], total["unfinished"]) == (6, 4, 2, 0)
    assert summary[("state", "FAILED")]["tasks"] == 2
    # failures group by exception class where Ray parsed one: evagg's own ValueError and
    # Ray's TASK_EXECUTION_EXCEPTION raised as ValueError are one group
    assert summary[("error_type", "ValueError")]["tasks"] == 2
    assert ("error_type", "TASK_EXECUTION_EXCEPTION") not in summary
    assert summary[("job", JOB)]["tasks"] == 4
    in_process = queries.summary(store).records()
    assert json.loads(json.dumps(in_process, default=str)) == json.loads(done.stdout)
