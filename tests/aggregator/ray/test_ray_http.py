"""POST /ray/events on a real agent: what lands in the lake is the reference mapping of the
body, a resent body stores nothing, a malformed body gets a 400 and nothing of it is
spooled, an unreadable event is named by its place in the body, the slower mapping paths
are counted, and a failed spool write answers 503 and lets the resend be stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from aggregator.ray.events import ray_events_to_rows
from aggregator.spool import Spool
from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess
from tests.raycli import RAY

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ray"


def load(name: str) -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / name).read_text())
    return data["events"] if isinstance(data, dict) else data


def post(agent: AgentProcess, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{agent.http_url}/ray/events", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read())


def test_a_body_lands_as_the_reference_rows_and_a_resend_stores_nothing(
        agent: AgentProcess) -> None:
    items = [e for name in ("02_excerpt_task_lifecycle_normal_and_failed.json",
                            "03_body_gcs_actor_and_worker_events_camelCase.json")
             for e in load(name)]
    body = json.dumps(items).encode()
    rows, rejected = ray_events_to_rows(items)
    assert rejected == []
    status, answer = post(agent, body)
    assert (status, answer["accepted"], answer["rejected"]) == (200, len(rows), 0)
    assert answer["duplicates"] == 0
    status, answer = post(agent, body)  # Ray's resend after a slow answer
    assert (status, answer["accepted"], answer["rejected"]) == (200, 0, 0)
    assert answer["duplicates"] == len(items)
    assert agent.metric('evagg_duplicate_frames_total{route="ray"}') == len(items)
    others = sum(1 for e in items if e["eventType"] not in (
        "TASK_DEFINITION_EVENT", "TASK_LIFECYCLE_EVENT", "ACTOR_TASK_DEFINITION_EVENT"))
    assert others > 0
    assert agent.metric('evagg_ray_careful_events_total{reason="other_event_type"}') == others
    assert agent.metric('evagg_ray_careful_events_total{reason="declined"}') == 0
    # every row but the agent's own heartbeats (the start heartbeat is in the lake first)
    stored = agent.wait_rows("SELECT event_id, state, task_id, node_id, attrs['ray_state'] "
                             "FROM events WHERE kind <> 'agent' ORDER BY event_id", len(rows))
    assert len(stored) == len(rows)  # nothing twice
    expected = sorted((r["event_id"], r.get("state"), r.get("task_id"),
                       r.get("node_id"), r["attrs"].get("ray_state"))
                      for r in rows)
    assert sorted(stored) == expected


def test_a_malformed_body_gets_a_400_and_nothing_of_it_is_spooled(agent: AgentProcess) -> None:
    good = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    received = agent.metric("evagg_received_events_total")
    for body, reason in ((json.dumps(good).encode()[:-20], "not valid JSON"),
                         (json.dumps([*good, 7]).encode(), "event 6 must be a JSON object"),
                         (json.dumps({"events": good}).encode(), "must be a JSON array")):
        status, answer = post(agent, body)
        assert status == 400 and reason in answer["error"], answer
    assert agent.metric("evagg_received_events_total") == received
    assert agent.metric('evagg_bad_input_total{reason="malformed",route="/ray/events"}') == 3
    status, answer = post(agent, json.dumps(good).encode())  # none of them was remembered
    assert (status, answer["accepted"]) == (200, len(ray_events_to_rows(good)[0]))


def test_unreadable_events_are_named_by_their_place_and_the_rest_is_kept(
        agent: AgentProcess) -> None:
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    items[4]["taskDefinitionEvent"]["taskId"] = "not base64!"
    items[3]["taskLifecycleEvent"]["stateTransitions"][0]["timestamp"] = "1960-01-01T00:00:00Z"
    status, answer = post(agent, json.dumps([items[0], *items]).encode())  # 0 twice
    rows, rejected = ray_events_to_rows(items)  # the definition is refused, one row later
    assert len(rejected) == 1
    assert (status, answer["accepted"], answer["rejected"]) == (200, len(rows) - 1, 2)
    assert answer["errors"][0].startswith("event 4: field 'time' is out of range")
    assert answer["errors"][1].startswith("event 5: TASK_DEFINITION_EVENT: taskId is not base64")
    # The slower paths are counted: the time before 1970 makes the bulk cast refuse the
    # body (mapped again time by time), then both odd events decline to the careful path.
    assert agent.metric('evagg_ray_careful_events_total{reason="declined"}') == 2
    assert agent.metric('evagg_ray_careful_events_total{reason="other_event_type"}') == 0
    assert agent.metric("evagg_ray_time_remaps_total") == 1


def test_a_failed_spool_write_answers_503_and_the_resend_is_stored(agent: AgentProcess) -> None:
    """The spool cannot grow (the agent's file size limit, so its writes fail with EFBIG):
    Ray gets a 503 and resends; nothing was remembered, so the resend is stored, once."""
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    rows, _ = ray_events_to_rows(items)
    assert post(agent, json.dumps(items[:1]).encode())[0] == 200  # the segment exists
    assert agent.proc is not None
    pid = agent.proc.pid
    unlimited = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    largest = max(p.stat().st_size for p in agent.state_dir.rglob("*") if p.is_file())
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (largest, unlimited[1]))
    try:
        body = json.dumps(items[1:]).encode()
        status, answer = post(agent, body)
        assert status == 503 and "spool write failed" in answer["error"], answer
        assert status_of(post(agent, body)) == 503  # failed again: still not remembered
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, unlimited)
    assert agent.metric('evagg_bad_input_total{reason="spool_write_failed",route="ray"}') == 2
    status, answer = post(agent, body)  # Ray's resend, once the disk takes writes again
    assert (status, answer["accepted"]) == (200, len(rows) - 1)
    assert post(agent, body)[1]["accepted"] == 0
    stored = agent.wait_rows("SELECT event_id FROM events WHERE source = 'ray'", len(rows))
    assert sorted(stored) == sorted((r["event_id"],) for r in rows)  # each once


def status_of(answer: tuple[int, dict[str, Any]]) -> int:
    return answer[0]


def test_a_resend_after_the_agent_was_killed_and_restarted_stores_nothing(
        agent: AgentProcess) -> None:
    """Killed after spooling a batch, before Ray had the answer: Ray sends the batch to
    the new agent, which knows its eventIds from the spool (aggregator/ray/recall.py)."""
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    body = json.dumps(items).encode()
    rows, _ = ray_events_to_rows(items)
    assert post(agent, body)[0] == 200
    agent.kill()
    agent.start()
    status, answer = post(agent, body)
    assert (status, answer["accepted"], answer["rejected"]) == (200, 0, 0)
    assert agent.metric('evagg_duplicate_frames_total{route="ray"}') == len(items)
    more = load("01_body_task_events_actor_methods_camelCase.json")
    assert post(agent, json.dumps(more).encode())[0] == 200  # new events are still stored
    more_rows, _ = ray_events_to_rows(more)
    stored = agent.wait_rows("SELECT event_id FROM events WHERE source = 'ray'",
                             len(rows) + len(more_rows))
    assert sorted(e for e, in stored) == sorted(r["event_id"] for r in rows + more_rows)


@pytest.mark.parametrize("fold", [True, False])
def test_before_ray_2_56_a_task_s_node_is_ray_s_id_not_the_agent_s_name(
        agent: AgentProcess, fold: bool) -> None:
    """Before 2.56 no event carries the emitting node, and the executor's RUNNING event
    has nodeId "": its row keeps node_id empty, so the tasks view takes Ray's id from the
    owner's terminal event rather than the agent's own node name."""
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    for item in items:
        item.pop("nodeId", None)
    rows, _ = ray_events_to_rows(items)
    terminal = {r["task_id"]: r["node_id"] for r in rows if r.get("state") in ("FINISHED",
                                                                               "FAILED")}
    assert terminal and all(terminal.values())
    assert post(agent, json.dumps(items).encode())[0] == 200
    stored = agent.wait_rows("SELECT state, node_id FROM events WHERE source = 'ray'",
                             len(rows))
    assert ("RUNNING", None) in stored and all(n != "test-node" for _, n in stored)
    store = Store(StoreOptions(str(agent.lake_dir), refresh_s=0.0, fold=fold))
    try:
        found = dict(store.execute("SELECT task_id, node_id FROM tasks").rows)
    finally:
        store.close()
    assert {t: found[t] for t in terminal} == terminal


def test_the_tasks_query_in_docs_ray_md_runs_on_the_agent_s_lake(
        agent: AgentProcess, capsys: pytest.CaptureFixture[str]) -> None:
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    assert post(agent, json.dumps(items).encode())[0] == 200
    rows, _ = ray_events_to_rows(items)
    agent.wait_rows("SELECT * FROM events", len(rows))
    text = (Path(__file__).resolve().parents[3] / "docs" / "ray.md").read_text()
    snippet = text.split("## The `tasks` view", 1)[1].split("```python\n", 1)[1]
    snippet = snippet.split("```", 1)[0].replace('LAKE = "lake"', f"LAKE = {str(agent.lake_dir)!r}")
    exec(compile(snippet, "docs/ray.md", "exec"), {})
    shown = capsys.readouterr().out
    failed = [r for r in rows if r.get("state") == "FAILED"]
    assert failed and failed[0]["attrs"]["exception_class"] in shown


def test_an_unreadable_spool_record_costs_the_recall_only_itself(agent: AgentProcess) -> None:
    """A record that does not decode (here one written behind the agent's back) is
    skipped and counted; the Ray batch spooled before it is still remembered."""
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    body = json.dumps(items).encode()
    assert post(agent, body)[0] == 200
    agent.stop()
    spool = Spool(agent.state_dir / "spool", max_bytes=256 * 2**20)
    spool.open()
    asyncio.run(spool.append(b"not an arrow record batch", 1, received_ns=1))
    spool.close()
    agent.start()
    status, answer = post(agent, body)
    assert (status, answer["accepted"], answer["duplicates"]) == (200, 0, len(items))
    assert agent.metric('evagg_worker_errors_total{type="unreadable_record",'
                        'worker="ray_recall"}') == 1


def test_events_without_an_event_id_are_deduplicated_by_their_content(
        agent: AgentProcess) -> None:
    """Ray always sends eventIds; an event without one is stored under a digest of its
    content, and Ray's resend of it (the same bytes) is dropped, also after a restart."""
    items = load("02_excerpt_task_lifecycle_normal_and_failed.json")
    for item in items:
        item.pop("eventId")
    body = json.dumps(items).encode()
    rows, _ = ray_events_to_rows(items)
    status, answer = post(agent, body)
    assert (status, answer["accepted"], answer["duplicates"]) == (200, len(rows), 0)
    status, answer = post(agent, body)
    assert (status, answer["accepted"], answer["duplicates"]) == (200, 0, len(items))
    agent.kill()
    agent.start()
    status, answer = post(agent, body)
    assert (status, answer["accepted"], answer["duplicates"]) == (200, 0, len(items))
    stored = agent.wait_rows("SELECT event_id FROM events WHERE source = 'ray'", len(rows))
    assert sorted(e for e, in stored) == sorted(r["event_id"] for r in rows)


def test_ray_s_cli_pointed_at_the_agent_is_told_where_the_state_api_is(
        agent: AgentProcess) -> None:
    """The agent takes Ray's events; `evagg dashboard` answers Ray's tools. A user who
    gives `ray list tasks` the agent's URL is told so, not a bare 404."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    done = subprocess.run([RAY, "list", "tasks", "--address", agent.http_url], env={
        **env, "RAY_USAGE_STATS_ENABLED": "0"}, capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode != 0
    assert "run `evagg dashboard`" in done.stdout + done.stderr, done.stderr
