"""A lake two real agents wrote, for the tests of `evagg query ddl`'s statements.

Two agents (nodes `node-owner` and `node-exec`) write into one lake, as two nodes of a
cluster do. Ray's recorded payloads (tests/fixtures/ray) go to their Ray Event Export
endpoint split as Ray splits them: an attempt's RUNNING (the executor's report) to one
node, its definition, PENDING, SUBMITTED and end (the owner's) to the other. evagg's own
events add tasks with RUNNING and terminal events at times with sub-microsecond digits,
FAILED with error types, a reported duration, an attempt split over both nodes, ops with
metrics maps and NaN (which lands in `nonfinite`), attrs, and a resent batch.

`compact_owner` runs `evagg compact` on the owner's partitions: they then have a merged
file and its task fragment, the executor's only raw files.
"""

from __future__ import annotations

import calendar
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.agentproc import REPO, AgentProcess, query_lake

FIXTURES = REPO / "tests" / "fixtures" / "ray"
OWNER, EXECUTOR = "node-owner", "node-exec"
S = 10**9
NOT_HEARTBEATS = "kind NOT IN ('agent', 'loss')"  # the agents' own, which keep coming


def rfc3339(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // S)) + f".{ns % S:09d}Z"


def ray_items() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for path in sorted(FIXTURES.glob("*.json")):
        data = json.loads(path.read_text())
        items += data["events"] if isinstance(data, dict) else data
    return items


def ran_here(item: dict[str, Any]) -> bool:
    """A lifecycle event with a RUNNING transition: what the executor's node reports."""
    body = item.get("taskLifecycleEvent") or item.get("task_lifecycle_event") or {}
    transitions = body.get("stateTransitions") or body.get("state_transitions") or []
    return any(t.get("state") == "RUNNING" for t in transitions)


def native_events(base: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(owner's, executor's) events of evagg's own producers."""
    def at(seconds: float, nanos: int = 0) -> str:
        return rfc3339(base + round(seconds * S) + nanos)

    def task(task_id: str, name: str, state: str, when: str, **more: Any) -> dict[str, Any]:
        return {"kind": "task", "event_id": f"{task_id}-{state}-{when}", "task_id": task_id,
                "name": name, "state": state, "time": when, "job_id": "job-1", **more}

    owner = []
    for i in range(6):  # RUNNING then FINISHED, times with nanoseconds
        owner += [task(f"fit{i}", "fit", "RUNNING", at(10 + i, 123_456_789),
                       attrs={"team": "infra", "shard": str(i)}),
                  task(f"fit{i}", "fit", "FINISHED", at(11 + i * 1.5, 987_654_321))]
    for i, error in enumerate(("ValueError", "KeyError", "ValueError")):
        owner += [task(f"load{i}", "load", "RUNNING", at(30 + i, 1)),
                  task(f"load{i}", "load", "FAILED", at(31 + i, 999), error_type=error,
                       error_message=f"{error}: bad shard {i}", stack_trace="Traceback ...")]
    owner += [task("report0", "report", "FINISHED", at(40, 500), duration_s=7.25),
              task("open0", "open", "RUNNING", at(41, 42))]  # still running
    for i in range(4):
        owner += [{"kind": "op", "event_id": f"op{i}", "name": "train_step", "state": "FINISHED",
                   "run_id": "run-1", "step": i, "time": at(50 + i, 777),
                   "duration_s": 0.5 + i, "metrics": {"loss": 1.0 / (i + 1), "lr": 0.001},
                   # a NaN metric, by name (HTTP's JSON has no NaN; emitters move it here)
                   "nonfinite": ["grad_norm"], "attrs": {"optimizer": "adam"}}]
    executor = [task("split0", "split", "RUNNING", at(60, 250)),  # the end on the owner's
                task("fit9", "fit", "RUNNING", at(61, 1))]
    owner += [task("split0", "split", "FINISHED", at(62, 750))]
    return owner, executor


def post(agent: AgentProcess, path: str, body: list[dict[str, Any]]) -> int:
    request = urllib.request.Request(f"{agent.http_url}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        reply = json.loads(answer.read())
    assert reply["rejected"] == 0, reply
    return int(reply["accepted"])


def _agent(workdir: Path, lake: Path, node: str) -> AgentProcess:
    sinks = (f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\n'
             'roll_interval = "1s"\n')
    agent = AgentProcess(workdir, sinks_toml=sinks)
    agent.config_path.write_text(agent.config_path.read_text().replace(
        'node_id = "test-node"', f'node_id = "{node}"'))
    return agent


def distinct_events(lake: Path) -> int:
    rows = query_lake(lake, f"SELECT count(DISTINCT event_id) FROM events WHERE {NOT_HEARTBEATS}")
    return int(rows[0][0])


@contextmanager
def two_agent_lake(workdir: Path) -> Iterator[Path]:
    """The lake, its agents kept running while the tests read it: a stopped agent's
    silence would let evagg infer ends for the open attempts, which the statements of
    `evagg query ddl` (the stored events alone) do not."""
    lake = workdir / "lake"
    for name in ("owner", "exec"):
        (workdir / name).mkdir()
    owner = _agent(workdir / "owner", lake, OWNER)
    executor = _agent(workdir / "exec", lake, EXECUTOR)
    try:
        owner.start()
        executor.start()
        base = (time.time_ns() // S - 600) * S
        items = ray_items()
        posted = post(owner, "/ray/events", [i for i in items if not ran_here(i)])
        posted += post(executor, "/ray/events", [i for i in items if ran_here(i)])
        mine, theirs = native_events(base)
        posted += post(owner, "/v1/events", mine) + post(executor, "/v1/events", theirs)
        # a resent batch: copies, in a later file of the owner's, as a resend comes (and
        # `evagg compact` then has the two files it merges at least)
        _wait_all_in_lake(owner)
        posted += post(owner, "/v1/events", mine[:4])
        for agent in (owner, executor):
            _wait_all_in_lake(agent)
        yield lake
    finally:
        codes = [agent.stop() for agent in (owner, executor)]
        assert codes == [0, 0], owner.log() + executor.log()


def _wait_all_in_lake(agent: AgentProcess, timeout: float = 60.0) -> None:
    """Until the agent has delivered to the lake every event it had accepted when asked
    (each POST is answered once its events are spooled; heartbeats go on after)."""
    accepted = agent.metric("evagg_received_events_total{")
    agent.wait_delivered(int(accepted), timeout)


def partitions(lake: Path, node: str) -> list[str]:
    return sorted(str(p.relative_to(lake)) for p in lake.glob(f"date=*/hour=*/node={node}"))


def compacted_copy(lake: Path, where: Path) -> Path:
    """A copy of the module's lake with the owner's partitions compacted (compact_owner),
    so that the tests of the lake as the agents left it still see it so, in any order."""
    copy = where / "compacted-lake"
    shutil.copytree(lake, copy)
    compact_owner(copy)
    return copy


def compacted_copy_with_a_late_file(lake: Path, where: Path) -> Path:
    """compacted_copy, with one of the owner's part files written after its hour's merge
    (an event that came late, or `evagg compact` on an hour still being written): the
    partition holds a merged file, its fragment, and a part file the fragment lacks."""
    import pyarrow.parquet as pq

    copy = where / "late-lake"
    shutil.copytree(lake, copy)
    newest = max((f for f in copy.rglob("part-*.parquet") if f"node={OWNER}" in str(f)),
                 key=lambda f: pq.read_metadata(f).num_rows)
    # its rows in three files: two to merge (whatever else the hour holds), one written late
    table = pq.read_table(newest)
    third = table.num_rows // 3
    assert third >= 1, table.num_rows
    newest.unlink()
    pieces = [table.slice(0, third), table.slice(third, third), table.slice(2 * third)]
    for piece, letter in zip(pieces[:2], "ab", strict=True):
        pq.write_table(piece, newest.with_name(f"{newest.stem}-{letter}.parquet"))
    compact_owner(copy)
    pq.write_table(pieces[2], newest.with_name(f"{newest.stem}-late.parquet"))
    return copy


def compact_owner(lake: Path) -> None:
    """`evagg compact` on the owner's partitions: a merged file and its task fragment."""
    for partition in partitions(lake, OWNER):
        done = evagg("compact", str(lake), "--partition", partition, "--grace", "0")
        assert "; 0 errors" in done and "-> compacted-" in done, done
    assert list((lake / "_tasks").rglob("*.pq")), "no task fragment was written"


def evagg(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def evagg_json(lake: Path, *query: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        evagg("query", "--data", str(lake), "--no-cache", *query, "--json"))
    return rows


def ddl(dialect: str, lake: Path) -> list[str]:
    """`evagg query ddl`'s statements, as a user splits them (at a `;` ending a line)."""
    text = evagg("query", "ddl", "--dialect", dialect, str(lake))
    return [s.strip() for s in text.split(";\n") if s.strip()]


# ---- the same answers from evagg and from the printed statements --------------------------

QUESTIONS = {  # two questions: a Spark query over this lake takes a while on two cores
    "events": ("SELECT event_id, kind, state, {us}(time) AS time_us, metrics['loss'] AS loss, "
               "metrics['lr'] AS lr, attrs['optimizer'] AS optimizer, attrs['team'] AS team, "
               "nonfinite FROM events WHERE kind NOT IN ('agent', 'loss')"),
    "tasks": ("SELECT task_id, attempt, ray_session, name, final_state, duration_s, error_type, "
              "exception_class, job_id, node_id, worker_id, pid, events, "
              "{us}(running_at) AS running_us, {us}(finished_at) AS finished_us, "
              "{us}(failed_at) AS failed_us, {us}(first_seen) AS first_us, inferred "
              "FROM tasks"),
}


def assert_same(got: dict[str, list[tuple[Any, ...]]], expected: dict[str, list[tuple[Any, ...]]],
                listed: list[dict[str, Any]]) -> None:
    """The engine's answers to QUESTIONS are evagg's, and its tasks per (name, final
    state, duration) those `evagg query tasks` lists, but for the ends evagg infers: the
    agents see no heartbeat of Ray's recorded nodes, so evagg ends those nodes' open
    attempts (NODE_DIED) a while after the events came, which the stored events (all the
    statements read) do not say."""
    assert got["events"] == expected["events"]
    by_state = Counter(r[1:3] for r in got["events"])  # (kind, state)
    assert by_state == Counter(r[1:3] for r in expected["events"])
    key = slice(0, 3)  # task_id, attempt, ray_session
    ended = {r[key] for r in expected["tasks"] if r[-1] is not None} - {
        r[key] for r in got["tasks"] if r[-1] is not None}
    ended |= {(r["task_id"], r["attempt"], r["ray_session"]) for r in listed
              if r["inferred"] is not None}  # evagg's second look may have inferred more
    assert {r[key] for r in got["tasks"]} == {r[key] for r in expected["tasks"]}
    assert [r for r in got["tasks"] if r[key] not in ended] == [
        r for r in expected["tasks"] if r[key] not in ended]
    stored = [(r["name"], r["final_state"], r["duration_s"]) for r in listed
              if (r["task_id"], r["attempt"], r["ray_session"]) not in ended]
    assert Counter(stored) == Counter(r[3:6] for r in got["tasks"] if r[key] not in ended)
    assert len(stored) >= 10  # the cases are there (the tests say which)


def normal(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows comparable across engines: floats to 1e-9, NaN named, lists as tuples; sorted."""
    def value(v: Any) -> Any:
        if isinstance(v, float):
            return "NaN" if v != v else round(v, 9)
        if isinstance(v, list | tuple):
            return tuple(value(x) for x in v)
        return v
    return sorted((tuple(value(v) for v in row.values()) for row in rows), key=repr)


def evagg_answers(lake: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {name: normal(evagg_json(lake, "sql", sql.format(us="epoch_us")))
            for name, sql in QUESTIONS.items()}


def us_of(event_id: str) -> int | None:
    """The microseconds of the time an evagg event's id spells (`<task>-<state>-<RFC 3339>`),
    cut down from its nanoseconds; None for other ids."""
    found = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{9})Z$", event_id)
    if not found:
        return None
    seconds = calendar.timegm(time.strptime(found[1], "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000 + int(found[2]) // 1000
