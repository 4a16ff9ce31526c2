"""docs/queries.md's examples run as printed (only the data path changed) on a lake that a
real agent wrote: the Ray Data snippet under a real local Ray gives the state counts and
per-name p50/p90/p99 of `evagg query summary --json`, and the DuckDB example gives the
failures and p90 of the `tasks` view.

The lake holds the captured Ray payloads of tests/fixtures/ray, Ray-shaped events made
here to hit the fold's tie rules (FAILED and FINISHED at the same time, a FINISHED after
a FAILED, a RUNNING after FINISHED, two events in one microsecond, a task id reused by a
second Ray session, a retry), and evagg's own task events with duration_s (reported
durations that win over the times, a resent batch, a state outside the ranks, a name off
the definition, tasks without a task_id).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.agentproc import REPO, AgentProcess
from tests.dashboard.rayshaped import S, b64, definition, lifecycle
from tests.raylocal import local_ray

DOC = REPO / "docs" / "queries.md"
FIXTURES = REPO / "tests" / "fixtures" / "ray"
RAY_PATH = '"s3://lake/evagg/"'
DUCKDB_PATH = "'lake/date=*/hour=*/node=*/*.parquet'"
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}  # else Ray writes a token into the home directory
OTHER_SESSION = "session_doc_second"
SQUARE = "Ho/20jYTJ4T///////////////8BAAAA"  # the fixtures' `square` task


def doc_block(section: str, language: str) -> str:
    """The one `language` code block of the docs/queries.md section titled `section`."""
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", text, re.S)
    assert len(blocks) == 1, blocks
    return str(blocks[0])


# ---- Ray-shaped events ------------------------------------------------------------------


def tie_rule_bodies(base: int) -> list[list[dict[str, Any]]]:
    """Ray POST bodies, in arrival order, whose tasks resolve only by the tie rules."""
    tie1, tie2, late1, late2, late3 = (b64(n, 24) for n in ("t1", "t2", "l1", "l2", "l3"))
    return [
        [definition(tie1, "tie", base), lifecycle(tie1, ("RUNNING", base + 1 * S)),
         lifecycle(tie1, ("FINISHED", base + 3 * S // 2))],
        [lifecycle(tie1, ("FAILED", base + 3 * S // 2))],  # same time: FAILED wins
        # FAILED and FINISHED 800 ns apart in one microsecond: a tie at DuckDB's clock
        [definition(tie2, "tie", base), lifecycle(tie2, ("RUNNING", base + 2 * S + 400),
                                                  ("FAILED", base + 2 * S + 2_100)),
         lifecycle(tie2, ("FINISHED", base + 2 * S + 2_900))],
        [definition(late1, "late", base), lifecycle(late1, ("RUNNING", base + 3 * S),
                                                    ("FAILED", base + 32 * S // 10)),
         lifecycle(late1, ("FINISHED", base + 34 * S // 10))],  # the later one wins
        [definition(late2, "late", base), lifecycle(late2, ("FINISHED", base + 43 * S // 10))],
        [lifecycle(late2, ("RUNNING", base + 4 * S)),
         lifecycle(late2, ("RUNNING", base + 45 * S // 10))],  # after FINISHED: no change
        [definition(late3, "late", base),
         lifecycle(late3, ("PENDING_ARGS_AVAIL", base + 5 * S),
                   ("SUBMITTED_TO_WORKER", base + 51 * S // 10), ("RUNNING", base + 52 * S // 10))],
        [definition(SQUARE, "square", base, session=OTHER_SESSION),  # a new Ray cluster
         lifecycle(SQUARE, ("RUNNING", base + 6 * S), ("FAILED", base + 25 * S // 4),
                   session=OTHER_SESSION)],
        [definition(SQUARE, "square", base, attempt=1),  # the fixture task's retry
         lifecycle(SQUARE, ("RUNNING", base + 7 * S), ("FAILED", base + 31 * S // 4), attempt=1)],
    ]


def fixture_bodies() -> list[list[dict[str, Any]]]:
    bodies = []
    for path in sorted(FIXTURES.glob("*.json")):
        data = json.loads(path.read_text())
        bodies.append(data["events"] if isinstance(data, dict) else data)
    return bodies


# ---- evagg's own task events ------------------------------------------------------------


def native_events(base: int) -> list[dict[str, Any]]:
    def task(task_id: str, name: str, state: str | None, at: float,
             **more: Any) -> dict[str, Any]:
        return {"kind": "task", "event_id": f"{task_id}-{state}-{at}", "task_id": task_id,
                "name": name, "state": state, "time": base + round(at * S), **more}

    events = [task(f"load{i}", "load", "FINISHED", 10 + i, duration_s=0.1 * (i + 1) ** 1.5)
              for i in range(9)]  # a reported duration, no RUNNING; attempt missing (0)
    events += [task("load9", "load", "FINISHED", 20, attempt=0, duration_s=1.0),
               task("load9", "load", "FINISHED", 21, attempt=0, duration_s=3.0)]  # latest
    for i in range(5):  # the reported duration wins over the times
        events += [task(f"step{i}", "step", "RUNNING", 30 + i, attempt=0),
                   task(f"step{i}", "step", "FINISHED", 30 + i + 0.1 * (i + 1), attempt=0,
                        duration_s=99.0)]
    events += [task("step5", "step", "PENDING", 40),
               task("step6", "step", "RUNNING", 41), task("step6", "step", "FAILED", 42.5,
                                                         duration_s=5.0, error_type="ValueError"),
               task("odd0", "odd", "RETRYING", 43),  # no ranked state: UNKNOWN
               task("named0", "named", "DEFINED", 44),  # the definition's name wins
               task("named0", "alias", "FINISHED", 45, duration_s=0.5),
               task("named1", "named", "DEFINED", 46),  # the definition outranks a later
               task("named1", "drifted", None, 47)]     # event with no state
    lone = {"kind": "task", "name": "lone"}  # no task_id: each event is a task of its own
    events += [{**lone, "event_id": "lone-a", "state": "FINISHED", "time": base + 48 * S,
                "duration_s": 0.8},
               {**lone, "event_id": "lone-b", "state": "FAILED", "time": base + 49 * S,
                "duration_s": 2.0, "error_type": "KeyError"},
               {**lone, "event_id": "lone-c", "task_id": "", "state": "FINISHED",
                "time": base + 50 * S}]
    return events


# ---- the lake and the local Ray ---------------------------------------------------------


def post(agent: AgentProcess, path: str, body: bytes) -> int:
    request = urllib.request.Request(f"{agent.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        reply = json.loads(answer.read())
    assert reply["rejected"] == 0, reply
    return int(reply["accepted"])


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The agent keeps running while the module reads its lake: a stopped agent's silence
    would end the made-up open tasks (dashboard/sql/ends.sql), which the recipes here,
    folding the raw events alone, do not do. It beats every 30 s, as agents do by
    default, so that a machine too busy to let it beat for a few seconds does not make
    it read as silent (7 s at the tests' usual 2 s)."""
    agent = AgentProcess(tmp_path_factory.mktemp("agent"), heartbeat_interval="30s").start()
    base = (time.time_ns() // S - 3600) * S  # within the DuckDB example's last day
    try:
        stored = sum(post(agent, "/ray/events", json.dumps(body).encode())
                     for body in fixture_bodies() + tie_rule_bodies(base))
        natives = native_events(base)
        stored += post(agent, "/v1/events", json.dumps(natives).encode())
        _wait_all_in_lake(agent)
        # resent, in a later file as a resend comes: `evagg compact` has two files to merge
        stored += post(agent, "/v1/events", json.dumps(natives[:3]).encode())
        assert _wait_all_in_lake(agent) >= stored
        _merge_hours(agent.lake_dir)  # the Ray Data recipe reads the merged hours' fragments
        yield agent.lake_dir
    finally:
        assert agent.stop() == 0, agent.log()


def _wait_all_in_lake(agent: AgentProcess) -> float:
    """Until the agent has delivered every event it had accepted when asked (each POST is
    answered once its events are spooled), its own included; how many that was."""
    received = agent.metric("evagg_received_events_total{")
    agent.wait_delivered(int(received))
    return received


def _merge_hours(lake: Path) -> None:
    """`evagg compact` merges what the agent's hour merge would an hour later: each
    node-hour's files into one, with its task fragment beside it under _tasks/."""
    done = subprocess.run([sys.executable, "-m", "aggregator", "compact", str(lake),
                           "--grace", "0"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "; 0 errors" in done.stdout, done.stdout + done.stderr
    assert list((lake / "_tasks").rglob("*.pq")), done.stdout


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    with local_ray(RAY_ENV, dashboard=False, num_cpus=1):
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield


def evagg_json(lake: Path, *query: str) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "aggregator", "query", "--data", str(lake),
                           "--no-cache", *query, "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def number(value: Any) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows with their floats to 1e-9 (durations are whole microseconds), sorted."""
    return sorted((tuple(round(v, 9) if isinstance(v, float) else v for v in row)
                   for row in rows), key=str)


# ---- the tests --------------------------------------------------------------------------


def test_the_made_up_tasks_hit_the_tie_rules_in_the_views(lake: Path) -> None:
    """Agreement proves little unless the lake holds the cases: the views' own fold."""
    rows = evagg_json(lake, "sql", "SELECT name, final_state, duration_s FROM tasks "
                                   "WHERE name IN ('tie', 'late', 'square', 'step', 'odd', "
                                   "'named', 'alias', 'drifted', 'lone')")
    found = rounded([(r["name"], r["final_state"], r["duration_s"]) for r in rows])
    expected = [("late", "FINISHED", 0.3), ("late", "FINISHED", 0.4), ("late", "RUNNING", None),
                ("named", "DEFINED", None), ("named", "FINISHED", 0.5),
                ("odd", "UNKNOWN", None),
                ("lone", "FINISHED", 0.8), ("lone", "FAILED", 2.0), ("lone", "FINISHED", None),
                ("square", "FAILED", 0.25), ("square", "FAILED", 0.75),
                ("square", "FINISHED", 0.053726),
                ("step", "FAILED", 5.0), ("step", "PENDING", None),
                *(("step", "FINISHED", 99.0) for _ in range(5)),
                ("tie", "FAILED", 2e-06), ("tie", "FAILED", 0.5)]
    assert found == rounded(expected)


def test_the_ray_data_snippet_gives_the_summary_of_evagg_query(lake: Path,
                                                               ray_cluster: None) -> None:
    code = doc_block("The same summary with Ray Data", "python")
    assert code.count(RAY_PATH) == 1
    namespace: dict[str, Any] = {}
    exec(compile(code.replace(RAY_PATH, repr(str(lake))), "<docs/queries.md>", "exec"),
         namespace)
    summary = evagg_json(lake, "summary")
    states = {r["value"]: r["tasks"] for r in summary if r["dimension"] == "state"}
    assert {state: int(n) for state, n in namespace["states"].items()} == states
    assert set(states) == {"FINISHED", "FAILED", "RUNNING", "PENDING", "DEFINED", "UNKNOWN"}
    expected = {r["value"]: (r["p50_s"], r["p90_s"], r["p99_s"])
                for r in summary if r["dimension"] == "name"}
    got = {name: tuple(number(q) for q in row) for name, row in namespace["quantiles"].items()}
    assert set(got) == set(expected) and None in expected  # tasks Ray never defined
    for name, quantiles in expected.items():
        assert [q is None for q in got[name]] == [q is None for q in quantiles], name
        assert [q or 0 for q in got[name]] == pytest.approx([q or 0 for q in quantiles],
                                                            rel=1e-9), name


def test_the_duckdb_example_gives_the_failures_of_the_tasks_view(lake: Path) -> None:
    sql = doc_block("DuckDB without evagg", "sql")
    assert sql.count(DUCKDB_PATH) == 1
    con = duckdb.connect()
    answers = [con.execute(statement).fetchall() for statement in
               sql.replace(DUCKDB_PATH, f"'{lake}/date=*/hour=*/node=*/*.parquet'").split(";")
               if statement.strip()]
    rows = evagg_json(lake, "sql", "SELECT name, error_type, count(*) AS failures, "
                                   "quantile_cont(duration_s, 0.9) AS p90_s FROM tasks "
                                   "WHERE final_state = 'FAILED' "
                                   "AND first_seen >= now() - INTERVAL 1 DAY GROUP BY ALL")
    views = rounded([(r["name"], r["error_type"], r["failures"], r["p90_s"]) for r in rows])
    assert rounded(answers[1]) == views
    assert {("tie", 2), ("square", 2), ("step", 1), ("lone", 1)} <= {(r[0], r[2]) for r in views}
