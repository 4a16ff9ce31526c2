"""Ray Event Export payloads -> evagg rows, on real payloads captured from Ray 2.60.

The fixtures in tests/fixtures/ray are bodies (and one excerpt) as Ray 2.60 POSTed them.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest

from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.ray.errors import error_columns, parse_error_message
from aggregator.ray.events import (
    RayBodyError,
    RecentEventIds,
    parse_ray_body,
    ray_events_to_rows,
    task_state,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ray"
TASKS_SQL = Path(__file__).resolve().parents[3] / "dashboard" / "sql" / "tasks.sql"
ALL_FIXTURES = sorted(FIXTURES.glob("*.json"))

SQUARE = "1e8ff6d236132784ffffffffffffffffffffffff01000000"  # taskId Ho/20jYTJ4T///...8BAAAA
BOOM = "239c2f70c73fbf73ffffffffffffffffffffffff01000000"  # taskId I5wvcMc/v3P///...8BAAAA
DRIVER = "ffffffffffffffffffffffffffffffffffffffff01000000"
NODE = "f480837016fe4d56882c2f517adf7db93ed5e2a1684bbee867f7e8ca"
NODE_B64 = "9ICDcBb+TVaILC9Ret99uT7V4qFoS77oZ/foyg=="
WORKER_DIED = "The worker died unexpectedly while executing this task."
T0 = 1_765_000_000_000_000_000  # a time of day in nanoseconds (2025-12-06)


def load(name: str) -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / name).read_text())
    return data["events"] if isinstance(data, dict) else data


def excerpt() -> list[dict[str, Any]]:
    return load("02_excerpt_task_lifecycle_normal_and_failed.json")


def ns(text: str) -> int:
    whole, _, fraction = text.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    return int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0"))


def mapped(items: list[Any]) -> list[dict[str, Any]]:
    rows, rejected = ray_events_to_rows(items)
    assert rejected == []
    return rows


def of_task(rows: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["task_id"] == task_id]


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=[p.name for p in ALL_FIXTURES])
def test_every_captured_payload_parses_maps_and_normalizes(path: Path) -> None:
    items = load(path.name)
    parsed = parse_ray_body(json.dumps(items).encode())  # Ray's own json.dumps spacing
    rows = mapped(parsed)
    assert len(rows) >= len(items)
    assert {r["source"] for r in rows} == {"ray"}
    assert all(re.fullmatch(r"[0-9a-f]{56}(-\d+)?", r["event_id"]) for r in rows)
    assert len({r["event_id"] for r in rows}) == len(rows)
    normalized = rows_to_batch(rows, Stamp.now("agent-node"))
    assert normalized.rejected == []
    assert normalized.batch.num_rows == len(rows)


def test_snake_case_keys_map_like_camel_case() -> None:
    camel = load("01_body_task_events_actor_methods_camelCase.json") + excerpt()
    snake = [_to_snake(item) for item in camel]
    assert "event_id" in snake[0] and "task_lifecycle_event" in snake[0]
    camel_rows, snake_rows = mapped(camel), mapped(snake)
    for a, b in zip(camel_rows, snake_rows, strict=True):
        assert {k: v for k, v in a.items() if k != "attrs"} == \
            {k: v for k, v in b.items() if k != "attrs"}
        assert a["attrs"].keys() == b["attrs"].keys()


def test_captured_snake_case_body() -> None:
    rows = mapped(load("05_body_task_lifecycle_snake_case_PRESERVE_PROTO_FIELD_NAME.json"))
    assert [r["state"] for r in rows] == ["RUNNING", "PENDING", "RUNNING", "PENDING", "RUNNING",
                                          "PENDING", "RUNNING"]
    assert rows[1]["attrs"]["ray_state"] == "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY"
    assert {r["attrs"]["worker_pid"] for r in rows} == {"11261"}
    assert rows[0]["task_id"] == "ffffffffffffffff9f9d2c64f2bbf30b95f27a0e01000000"
    assert rows[0]["node_id"] == "2f30f9dc1df4d89403f489a3b2814cbba84b6ef9a5baeec1d90c2def"


def test_lifecycle_excerpt_rows() -> None:
    rows = mapped(excerpt())
    square = of_task(rows, SQUARE)
    definition = next(r for r in square if r["state"] == "DEFINED")
    assert definition["name"] == "square"
    assert definition["parent_id"] == DRIVER
    assert definition["attrs"]["ray_function"] == "workload.square"
    assert definition["attrs"]["ray_task_type"] == "NORMAL_TASK"
    owner = [r for r in square if r["attrs"].get("ray_state") and r["state"] != "RUNNING"]
    assert [(r["state"], r["attrs"]["ray_state"]) for r in owner] == [
        ("PENDING", "PENDING_ARGS_AVAIL"), ("PENDING", "PENDING_NODE_ASSIGNMENT"),
        ("SUBMITTED", "SUBMITTED_TO_WORKER"), ("FINISHED", "FINISHED")]
    assert [r["time"] for r in owner] == [ns("2026-11-29T12:05:22.487696773Z"),
                                         ns("2026-11-29T12:05:22.488427535Z"),
                                         ns("2026-11-29T12:05:22.868099610Z"),
                                         ns("2026-11-29T12:05:22.922928650Z")]
    assert [r["event_id"][-2:] for r in owner] == ["-0", "-1", "-2", "-3"]
    assert {r["worker_id"] for r in owner} == {
        "e78289f3154e28b41866ae2f0352a590f97a68a848eee8281df6d83d"}
    assert {(r["job_id"], r["node_id"], r["attempt"]) for r in square} == {("01000000", NODE, 0)}
    running = next(r for r in square if r["state"] == "RUNNING")
    assert running["attrs"]["worker_pid"] == "6526"
    assert running["worker_id"] is None  # the executor does not report its own id
    assert "pid" not in running  # the pid column is the agent's to stamp
    assert "worker-e78289f3" in running["attrs"]["ray_task_log_info"]


def test_failed_task_error_class_message_and_stack_without_ansi() -> None:
    rows = of_task(mapped(excerpt()), BOOM)
    failed = [r for r in rows if r.get("error_type")]
    assert len(failed) == 1 and failed[0]["state"] == "FAILED"
    row = failed[0]
    assert row["error_type"] == "TASK_EXECUTION_EXCEPTION"
    assert row["error_message"] == "ValueError: intentional failure for x=7"
    assert row["attrs"]["exception_class"] == "ValueError"
    assert row["stack_trace"] == (
        "ray::boom() (pid=6525, ip=192.0.2.2)\n"
        '  File "/home/user/job/workload.py", line 13, in boom\n'
        '    raise ValueError(f"intentional failure for x={x}")')
    assert "\x1b" not in row["stack_trace"]


def test_actor_method_failure() -> None:
    rows = mapped(load("01_body_task_events_actor_methods_camelCase.json"))
    failed = next(r for r in rows if r.get("error_type"))
    assert failed["error_message"] == "RuntimeError: actor method failure"
    assert failed["attrs"]["exception_class"] == "RuntimeError"
    assert failed["stack_trace"].startswith("ray::Counter.fail() (pid=6615")
    assert failed["stack_trace"].endswith('raise RuntimeError("actor method failure")')
    definition = next(r for r in rows if r["state"] == "DEFINED")
    assert (definition["name"], definition["actor_id"]) == (
        "Counter.fail", "a5bb2facdd9ef499094add5801000000")
    assert definition["attrs"]["ray_task_type"] == "ACTOR_TASK"


def test_mapping_is_deterministic_so_resends_get_the_same_ids() -> None:
    items = excerpt()
    first = [r["event_id"] for r in mapped(items)]
    again = [r["event_id"] for r in mapped(copy.deepcopy(items))]
    assert first == again


def test_ray_249_task_execution_event() -> None:
    times = {"1": "2025-08-01T10:00:00.000000100Z", "5": "2025-08-01T10:00:00.5Z",
             "8": "2025-08-01T10:00:01.000200300Z", "12": "2025-08-01T10:00:02Z"}
    item = {
        "eventId": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGw==",
        "sourceType": "CORE_WORKER",
        "eventType": "TASK_EXECUTION_EVENT",
        "timestamp": "2025-08-01T10:00:02Z",
        "severity": "INFO",
        "sessionName": "session_2025-08-01_10-00-00_000000_1",
        "taskExecutionEvent": {
            "taskId": "Ho/20jYTJ4T///////////////8BAAAA",
            "taskAttempt": 1,
            "taskState": {"12": times["12"], "8": times["8"], "1": times["1"], "5": times["5"]},
            "rayErrorInfo": {"errorType": "WORKER_DIED", "errorMessage": WORKER_DIED},
            "nodeId": NODE_B64,
            "workerId": "",
            "workerPid": 4242,
        },
    }
    rows = mapped([item])
    assert [(r["state"], r["attrs"]["ray_state"]) for r in rows] == [
        ("PENDING", "PENDING_ARGS_AVAIL"), ("SUBMITTED", "SUBMITTED_TO_WORKER"),
        ("RUNNING", "RUNNING"), ("FAILED", "FAILED")]
    assert [r["time"] for r in rows] == [ns(times[k]) for k in ("1", "5", "8", "12")]
    assert {(r["task_id"], r["attempt"], r["node_id"]) for r in rows} == {(SQUARE, 1, NODE)}
    assert rows[-1]["error_type"] == "WORKER_DIED"
    assert rows[-1]["error_message"] == WORKER_DIED
    assert "stack_trace" not in rows[-1] and "exception_class" not in rows[-1]["attrs"]
    assert rows[0]["event_id"] == "000102030405060708090a0b0c0d0e0f101112131415161718191a1b-0"


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "not valid JSON"),
    (b"[{", "not valid JSON"),
    (b'{"eventId": "x"}', "must be a JSON array of events, not an object"),
    (b'"text"', "not a string"),
    (b'[{"eventId": "AA=="}, 5]', "event 1 must be a JSON object, not a number"),
    (b"[null]", "event 0 must be a JSON object, not null"),
])
def test_malformed_bodies_raise_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(RayBodyError, match=re.escape(reason)):
        parse_ray_body(body)


def test_unknown_event_types_and_fields_are_kept() -> None:
    future = {"eventId": "AQID", "eventType": "GPU_MEMORY_EVENT",
              "timestamp": "2026-01-01T00:00:00Z", "gpuMemoryEvent": {"bytes": "123"},
              "nodeId": NODE_B64}
    lifecycle = copy.deepcopy(excerpt()[0])
    lifecycle["taskLifecycleEvent"]["queueDepth"] = "7"
    lifecycle["taskLifecycleEvent"]["newThing"] = {"a": 1}
    lifecycle["brandNewEnvelopeField"] = "yes"
    rows = mapped([future, lifecycle])
    assert rows[0]["kind"] == "ray" and rows[0]["name"] == "GPU_MEMORY_EVENT"
    assert orjson.loads(rows[0]["attrs"]["ray_raw"]) == future
    assert (rows[0]["event_id"], rows[0]["time"], rows[0]["node_id"]) == (
        "010203", ns("2026-01-01T00:00:00.0Z"), NODE)
    attrs = rows[1]["attrs"]
    assert (attrs["ray_queue_depth"], attrs["ray_new_thing"]) == ("7", '{"a":1}')
    assert attrs["ray_brand_new_envelope_field"] == "yes"
    assert rows_to_batch(rows, Stamp.now()).rejected == []


def test_known_event_with_nothing_to_map_is_kept_whole() -> None:
    item = copy.deepcopy(load("03_body_gcs_actor_and_worker_events_camelCase.json")[1])
    item["actorLifecycleEvent"]["stateTransitions"] = []
    (row,) = mapped([item])
    assert (row["kind"], row["name"]) == ("ray", "ACTOR_LIFECYCLE_EVENT")
    assert orjson.loads(row["attrs"]["ray_raw"]) == item


def test_event_without_payload_or_id_is_kept_with_a_stable_id() -> None:
    item = {"eventType": "TASK_LIFECYCLE_EVENT", "timestamp": "2026-01-01T00:00:00.5Z"}
    rows = mapped([item])
    assert rows[0]["kind"] == "ray" and len(rows[0]["event_id"]) == 56
    assert mapped([dict(item)])[0]["event_id"] == rows[0]["event_id"]


def test_unreadable_fields_reject_only_that_event() -> None:
    good, bad_id, bad_time = copy.deepcopy(excerpt()[:3])
    bad_id["taskLifecycleEvent"]["taskId"] = "not base64!"
    bad_time["timestamp"] = "yesterday"
    rows, rejected = ray_events_to_rows([good, bad_id, bad_time, 7])
    assert len(rows) == 1 and rows[0]["task_id"] == BOOM
    assert [i for i, _ in rejected] == [1, 2, 3]
    assert "TASK_LIFECYCLE_EVENT: taskId is not base64" in rejected[0][1]
    assert "TASK_DEFINITION_EVENT: timestamp" in rejected[1][1]
    assert "must be a JSON object" in rejected[2][1]


def test_task_state_mapping() -> None:
    assert [task_state(s) for s in ("PENDING_ARGS_AVAIL", "PENDING_OBJ_STORE_MEM_AVAIL",
                                    "SUBMITTED_TO_WORKER", "GETTING_AND_PINNING_ARGS",
                                    "RUNNING_IN_RAY_GET", "FINISHED", "FAILED", "NEW_STATE")] == [
        "PENDING", "PENDING", "SUBMITTED", "SUBMITTED", "RUNNING", "FINISHED", "FAILED",
        "NEW_STATE"]


def test_gcs_entities_and_death_causes() -> None:
    rows = mapped(load("03_body_gcs_actor_and_worker_events_camelCase.json")
                  + load("06_body_gcs_driver_job_and_worker_events_camelCase.json"))
    actor = [r for r in rows if r["kind"] == "actor"]
    assert [r["state"] for r in actor] == ["DEFINED", "DEPENDENCIES_UNREADY", "PENDING_CREATION",
                                          "ALIVE"]
    assert actor[0]["name"] == "probe_counter" and actor[0]["attrs"]["ray_class_name"] == "Counter"
    assert actor[3]["attrs"]["worker_pid"] == "8149"
    assert "ray_restart_reason" not in actor[3]["attrs"]  # the enum's 0 value, not a restart
    job = [r for r in rows if r["kind"] == "job"]
    assert [(r["state"], r["job_id"]) for r in job] == [("DEFINED", "01000000"),
                                                        ("CREATED", "01000000")]
    assert job[0]["attrs"]["ray_driver_pid"] == "7840"
    workers = [r for r in rows if r["kind"] == "worker" and r["state"] == "DEFINED"]
    assert sorted(r["attrs"]["worker_pid"] for r in workers) == ["8065", "8066", "8149"]
    dead = copy.deepcopy(load("03_body_gcs_actor_and_worker_events_camelCase.json")[1])
    dead["actorLifecycleEvent"]["stateTransitions"] = [{
        "state": "DEAD", "timestamp": "2026-11-29T12:06:05Z", "restartReason": "ACTOR_FAILURE",
        "deathCause": {"actorDiedErrorContext": {
            "errorMessage": "The actor is dead because it was killed by `ray.kill`.",
            "reason": "RAY_KILL", "neverStarted": False}}}]
    died = mapped([dead])[0]
    assert (died["state"], died["error_type"]) == ("DEAD", "RAY_KILL")
    assert died["error_message"] == "The actor is dead because it was killed by `ray.kill`."
    assert "RAY_KILL" in died["attrs"]["ray_death"]


def test_worker_and_node_death_info() -> None:
    base = {"eventId": "AQID", "timestamp": "2026-01-01T00:00:00Z", "sessionName": "s"}
    worker = {**base, "eventType": "WORKER_LIFECYCLE_EVENT", "workerLifecycleEvent": {
        "workerId": "AQID", "jobId": "AQAAAA==", "stateTransitions": [{
            "state": "DEAD", "timestamp": "2026-01-01T00:00:01Z", "endTimeMs": "0",
            "deathInfo": {"exitType": "SYSTEM_ERROR", "exitDetail": "OOM killed",
                          "memoryUsedBytes": "1024"}}]}}
    node = {**base, "eventId": "BAUG", "eventType": "NODE_LIFECYCLE_EVENT", "nodeLifecycleEvent": {
        "nodeId": "AQID", "stateTransitions": [{
            "state": "DEAD", "timestamp": "2026-01-01T00:00:02Z", "aliveSubState": "UNSPECIFIED",
            "resources": {"CPU": 2.0},
            "deathInfo": {"reason": "UNEXPECTED_TERMINATION", "reasonMessage": "gone"}}]}}
    w, n = mapped([worker, node])
    assert (w["kind"], w["worker_id"], w["job_id"], w["error_type"], w["error_message"]) == (
        "worker", "010203", "01000000", "SYSTEM_ERROR", "OOM killed")
    assert "ray_end_time_ms" not in w["attrs"]  # int64 zero is the default value
    assert (n["kind"], n["node_id"], n["error_type"], n["error_message"]) == (
        "node", "010203", "UNEXPECTED_TERMINATION", "gone")
    assert n["attrs"]["ray_resources"] == '{"CPU":2.0}'
    assert "ray_alive_sub_state" not in n["attrs"]


def test_runtime_env_secrets_are_redacted() -> None:
    item = copy.deepcopy(excerpt()[2])
    item["taskDefinitionEvent"]["serializedRuntimeEnv"] = json.dumps(
        {"env_vars": {"HF_TOKEN": "hf_abc", "OMP_NUM_THREADS": "4"}, "pip": ["x"]})
    env = json.loads(mapped([item])[0]["attrs"]["ray_runtime_env"])
    assert env == {"env_vars": {"HF_TOKEN": "[redacted]", "OMP_NUM_THREADS": "4"}, "pip": ["x"]}


def test_profile_events_become_timed_rows() -> None:
    item = {"eventId": "AQID", "eventType": "TASK_PROFILE_EVENT",
            "timestamp": "2026-01-01T00:00:00Z",
            "taskProfileEvents": {"taskId": "Ho/20jYTJ4T///////////////8BAAAA", "attemptNumber": 0,
                                  "jobId": "AQAAAA==", "profileEvents": {
                                      "componentType": "worker", "componentId": "AQID",
                                      "nodeIpAddress": "192.0.2.2", "events": [
                                          {"eventName": "task:execute",
                                           "startTime": "1795953960600733375",
                                           "endTime": "1795953960601733375", "extraData": ""}]}}}
    (row,) = mapped([item])
    assert (row["kind"], row["name"], row["task_id"], row["worker_id"]) == (
        "ray_profile", "task:execute", SQUARE, "010203")
    assert (row["time"], row["duration_s"]) == (1795953960600733375, 0.001)
    assert row["attrs"]["ray_node_ip_address"] == "192.0.2.2"


@pytest.mark.parametrize(("text", "message", "cls", "stack"), [
    ("User exception:\n\x1b[36mray::f()\x1b[39m (pid=1, ip=x)\n  File \"a.py\", line 1, in f\n"
     "    g()\nKeyError: 'k'\n", "KeyError: 'k'", "KeyError",
     "ray::f() (pid=1, ip=x)\n  File \"a.py\", line 1, in f\n    g()"),
    ("ray::f() (pid=1)\n  File \"a.py\", line 2, in f\n    raise E('a\\nb')\nmod.E: first\nsecond",
     "mod.E: first\nsecond", "mod.E", "ray::f() (pid=1)\n  File \"a.py\", line 2, in f\n"
     "    raise E('a\\nb')"),
    ("ray.exceptions.RayTaskError(ValueError): ray::outer()",
     "ray.exceptions.RayTaskError(ValueError): ray::outer()",
     "ray.exceptions.RayTaskError(ValueError)", None),
    ("The worker died unexpectedly.\nSee the logs.", "The worker died unexpectedly.\nSee the logs.",
     None, None),
    ("  File \"a.py\", line 3, in f\nStopIteration", "StopIteration", "StopIteration",
     "  File \"a.py\", line 3, in f"),
    ("  File \"a.py\", line 3, in f\nBoom: custom", "Boom: custom", "Boom",
     "  File \"a.py\", line 3, in f"),  # after a frame any name is the class
    ("KeyboardInterrupt", "KeyboardInterrupt", "KeyboardInterrupt", None),
    ("TimeoutError: took too long", "TimeoutError: took too long", "TimeoutError", None),
    ("bye", "bye", None, None),  # a death's prose, not an exception
    ("Killed", "Killed", None, None),
    ("Note: the node was drained", "Note: the node was drained", None, None),
])
def test_parse_error_message(text: str, message: str, cls: str | None, stack: str | None) -> None:
    parsed = parse_error_message(text)
    assert (parsed.message, parsed.exception_class, parsed.stack_trace) == (message, cls, stack)


@pytest.mark.parametrize(("error_type", "cls"), [
    ("WORKER_DIED", None),  # a transport's error in a death's prose: grouped by Ray's type
    ("NODE_DIED", None),
    ("TASK_EXECUTION_EXCEPTION", "RpcError"),  # the task's own exception, if it is one
])
def test_a_death_is_grouped_by_its_type_not_by_a_head_in_its_prose(
        error_type: str, cls: str | None) -> None:
    """One kind of crash read as two error groups: a worker that died gave
    `RpcError: RPC error: Socket closed rpc_code: 14` on its retry."""
    row = error_columns(error_type, "RpcError: RPC error: Socket closed rpc_code: 14")
    assert row.get("attrs", {}).get("exception_class") == cls
    assert row["error_type"] == error_type
    traced = error_columns("WORKER_DIED", "Traceback (most recent call last):\n"
                                          '  File "x.py", line 1, in f\nMemoryError: big')
    assert traced["attrs"]["exception_class"] == "MemoryError"  # a traceback names it


def test_recent_event_ids_two_steps_and_bounded() -> None:
    recent = RecentEventIds(capacity=4)
    items = [{"eventId": "a"}, {"event_id": "b"}, {"eventId": "a"}, {"x": 1}]
    assert recent.filter_new(items) == [True, True, False, True]
    assert recent.filter_new(items) == [True, True, False, True]  # looking remembers nothing
    recent.confirm(items)
    assert len(recent) == 3 and {"x": 1} in recent  # no eventId: known by its content
    assert recent.filter_new(["a", "b", "c", None]) == [False, False, True, True]
    recent.confirm(["c", "d", "e"])  # the young generation fills at "c" and turns old
    assert len(recent) == 6 and "a" in recent
    recent.confirm(["f", "g", "h", "i"])  # two generations of 4: "a".."c" are gone
    assert recent.filter_new(["a", "c", "d", "i"]) == [True, True, False, False]


# ---- the tasks view ---------------------------------------------------------------------


def tasks_from(rows: list[dict[str, Any]],
               session: str = "session_2026-11-29_12-05-18_302995_6318",
               ) -> dict[tuple[str, int], dict[str, Any]]:
    """The tasks view's rows of one Ray session (and evagg's own), by (task_id, attempt)."""
    normalized = rows_to_batch(rows, Stamp.now("agent-node"))
    assert normalized.rejected == []
    con = duckdb.connect()
    con.register("stored", pa.Table.from_batches([normalized.batch]))
    con.execute("CREATE VIEW events_raw AS SELECT * FROM stored")
    con.execute("CREATE VIEW events AS SELECT * FROM events_raw")
    con.execute(TASKS_SQL.read_text())
    table = con.execute("SELECT * FROM tasks").to_arrow_table()
    for index, field in enumerate(table.schema):  # timestamps as integer microseconds
        if pa.types.is_timestamp(field.type):
            table = table.set_column(index, field.name, table[field.name].cast(pa.int64()))
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for row in table.to_pylist():
        if row["ray_session"] not in (None, session):
            continue
        assert (row["task_id"], row["attempt"]) not in out
        out[(row["task_id"], row["attempt"])] = row
    return out


def test_tasks_view_folds_out_of_order_split_events() -> None:
    items = excerpt()[::-1]  # RUNNING now arrives after FINISHED and FAILED
    rows = mapped(items)
    tasks = tasks_from(rows + mapped(items[:3]))  # and a resent batch on top
    assert set(tasks) == {(SQUARE, 0), (BOOM, 0)}
    square, boom = tasks[(SQUARE, 0)], tasks[(BOOM, 0)]
    assert (square["name"], square["final_state"], boom["name"], boom["final_state"]) == (
        "square", "FINISHED", "boom", "FAILED")
    assert square["running_at"] == ns("2026-11-29T12:05:22.869202453Z") // 1000
    assert square["duration_s"] == pytest.approx(0.922928650 - 0.869202453, abs=2e-6)
    assert (square["job_id"], square["node_id"], square["pid"], square["parent_id"]) == (
        "01000000", NODE, 6526, DRIVER)
    assert square["worker_id"] == "e78289f3154e28b41866ae2f0352a590f97a68a848eee8281df6d83d"
    assert (square["events"], square["source"], square["function"]) == (6, "ray", "workload.square")
    assert square["ray_session"] == "session_2026-11-29_12-05-18_302995_6318"
    assert (boom["error_type"], boom["exception_class"], boom["error_message"]) == (
        "TASK_EXECUTION_EXCEPTION", "ValueError", "ValueError: intentional failure for x=7")
    assert boom["stack_trace"].startswith("ray::boom() (pid=6525")
    assert square["error_type"] is None and boom["pid"] == 6525


def test_tasks_view_keeps_tasks_whose_running_never_arrived() -> None:
    tasks = tasks_from(mapped(load("01_body_task_events_actor_methods_camelCase.json")))
    no_running = tasks[("18b2ad3c688fb947a5bb2facdd9ef499094add5801000000", 0)]
    assert (no_running["final_state"], no_running["running_at"], no_running["duration_s"]) == (
        "FINISHED", None, None)
    assert no_running["submitted_at"] is not None
    failed = tasks[("c76a79b2875a7251a5bb2facdd9ef499094add5801000000", 0)]
    assert (failed["name"], failed["final_state"], failed["actor_id"]) == (
        "Counter.fail", "FAILED", "a5bb2facdd9ef499094add5801000000")


def test_tasks_view_separates_attempts_and_sessions_and_reads_our_own_task_events() -> None:
    first = excerpt()
    retry = copy.deepcopy(first)
    for item in retry:
        item["eventId"] = item["eventId"][:-4] + "AAA="
        payload = item.get("taskLifecycleEvent") or item.get("taskDefinitionEvent")
        payload["taskAttempt"] = 1
    other_cluster = copy.deepcopy(first[:1])
    other_cluster[0]["sessionName"] = "session_other"
    other_cluster[0]["eventId"] = "AAAA" + other_cluster[0]["eventId"][4:]
    ours = [
        {"kind": "task", "source": "evagg", "task_id": "t1", "name": "load", "state": "RUNNING",
         "time": T0 + 1_000_000_000, "job_id": "j"},
        {"kind": "task", "source": "evagg", "task_id": "t1", "state": "FINISHED",
         "time": T0 + 3_500_000_000, "duration_s": 2.4},
        {"kind": "task", "source": "evagg", "task_id": "t2", "name": "save", "state": "FINISHED",
         "time": T0 + 5_000_000_000, "duration_s": 0.25},
    ]
    tasks = tasks_from(mapped(first + retry + other_cluster) + ours)
    assert (SQUARE, 1) in tasks and (BOOM, 1) in tasks
    assert tasks[(BOOM, 1)]["final_state"] == "FAILED" and tasks[(BOOM, 1)]["name"] == "boom"
    elsewhere = tasks_from(mapped(first + other_cluster), session="session_other")
    assert set(elsewhere) == {(BOOM, 0)} and elsewhere[(BOOM, 0)]["final_state"] == "RUNNING"
    assert tasks[("t1", 0)]["final_state"] == "FINISHED"
    # a reported duration wins over end - running start (3.5 - 1.0): docs/queries.md
    assert tasks[("t1", 0)]["duration_s"] == pytest.approx(2.4)
    assert tasks[("t2", 0)]["duration_s"] == pytest.approx(0.25)  # the terminal's own
    assert tasks[("t1", 0)]["name"] == "load" and tasks[("t1", 0)]["source"] == "evagg"


def _to_snake(value: Any, key: str = "") -> Any:
    """What PRESERVE_PROTO_FIELD_NAME does: proto field names snake_case, map keys kept."""
    maps = {"requiredResources", "refIds", "labelSelector", "labels", "resources", "metadata"}
    if isinstance(value, dict):
        if key in maps:
            return value
        return {_snake(k): _to_snake(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_snake(v) for v in value]
    return value


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()
