"""Ray's log questions answered from the lake after the files are gone: `evagg query
logs`, Ray's own log client against `evagg dashboard`, and `ray logs` through the
documented one-liner."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import REPO, AgentProcess
from tests.aggregator.raylogs.lakefiles import shipped
from tests.aggregator.raylogs.rayevents import (
    NODE_HEX,
    SESSION,
    failed_event,
    post,
    running_event,
    submitted_event,
    task_hex,
)
from tests.dashboard.serve import serving
from tests.waiting import wait_until

LATER = "session_2026-11-30_08-00-00_000001_7001"  # a second cluster, started after SESSION
BIG = [f"line {i}: ünïcødé ✓ {'.' * (i % 7)}\n" for i in range(2000)]
SMALL = ["second task 1\n", "second task 2\n", "no newline at the end"]
ERR = ["Traceback (most recent call last):\n", "ValueError: boom\n"]
PREAMBLE = ("--- Log has been truncated to last {} lines. Use `--tail` flag to toggle. Set "
            "to -1 for getting the entire file. ---\n\n")
ONE_LINER = ("import sys, ray.util.state.api as api, ray.util.state.state_cli as cli; "
             "url = sys.argv.pop(1); api.ray_address_to_api_server_url = lambda _: url; "
             "cli._get_head_node_ip = lambda _: None; "
             "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()")


@dataclass
class Lake:
    root: Path
    big: str  # the task that printed 2,000 lines
    small: str
    worker_file: str
    quiet: str  # printed nothing: its stdout is empty, not the next task's lines
    raised: str  # printed nothing, then raised: empty too (Ray reports no end for it)
    crashed: str  # its worker died before Ray named its range: its worker's file is named
    worker: str


# An actor's method from a recorded Ray body: Ray names no log range for actor tasks.
ACTOR_BODY = REPO / "tests/fixtures/ray/01_body_task_events_actor_methods_camelCase.json"
ACTOR_TASK = "c76a79b2875a7251a5bb2facdd9ef499094add5801000000"
ACTOR = "a5bb2facdd9ef499094add5801000000"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    """One worker's files: a task printing 2,000 lines, then one printing three; shipped
    by a real agent, then the files deleted as a dead cluster's are."""
    work = tmp_path_factory.mktemp("raylogs")
    ray_root = work / "ray"
    logs = ray_root / SESSION / "logs"
    logs.mkdir(parents=True)
    out = logs / f"worker-{1:056x}-01000000-6001.out"
    err = out.with_suffix(".err")
    agent_dir = work / "agent"
    agent_dir.mkdir()
    agent = AgentProcess(agent_dir, extra_toml=f'[ray]\nlog_dir = "{ray_root}"\n').start()
    try:
        big, small, quiet, raised = task_hex(1), task_hex(2), task_hex(3), task_hex(6)
        crashed, worker = task_hex(7), f"{1:056x}"
        out.write_text("".join(BIG))
        err.write_text("".join(ERR))
        x, e = out.stat().st_size, err.stat().st_size
        with out.open("a") as handle:
            handle.write("".join(SMALL))
        y = out.stat().st_size
        post(agent.http_url, [
            running_event(big, str(out), str(err)),
            running_event(big, str(out), str(err), ends=(x, e)),
            # ran between the two and printed nothing: its reported end is its start
            running_event(quiet, str(out), str(err), start=x, err_start=e),
            running_event(quiet, str(out), str(err), start=x, err_start=e, ends=(x, e)),
            # ran between the two, printed nothing and raised: only its RUNNING names
            # the (empty) range, and its FAILED says its worker lived to the end
            running_event(raised, str(out), str(err), start=x, err_start=e),
            failed_event(raised, "TASK_EXECUTION_EXCEPTION"),
            # sent to the worker, which then died (os._exit) before its RUNNING went out
            submitted_event(crashed, worker),
            failed_event(crashed, "WORKER_DIED"),
            running_event(small, str(out), str(err), start=x, err_start=e),
            running_event(small, str(out), str(err), start=x, err_start=e, ends=(y, e)),
            # a newer cluster (its own node): it reused one task id of this one, as
            # Ray's clusters do
            running_event(task_hex(4), str(out), str(err), start=x, err_start=e),
            later_node(running_event(task_hex(4), str(out), str(err), start=x, session=LATER)),
            later_node(running_event(task_hex(5), str(out), str(err), session=LATER))])
        post(agent.http_url, json.loads(ACTOR_BODY.read_bytes()))
        wait_until(lambda: shipped(agent.lake_dir, out.name) == out.read_bytes(), 60,
                   "the worker's stdout in the lake")
        wait_until(lambda: shipped(agent.lake_dir, err.name) == err.read_bytes(), 60,
                   "the worker's stderr in the lake")
        assert agent.stop() == 0
    finally:
        if agent.running:
            agent.kill()
    shutil.rmtree(ray_root)  # the cluster is gone, and its files with it
    yield Lake(agent.lake_dir, big, small, out.name, quiet, raised, crashed, worker)


def later_node(event: dict[str, Any]) -> dict[str, Any]:
    return {**event, "nodeId": base64.b64encode(bytes(28)).decode()}


def evagg(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True,
                          cwd=REPO, timeout=120, check=False)


def test_query_logs_prints_what_ray_logs_task_prints(lake: Lake) -> None:
    done = evagg("query", "logs", "--data", str(lake.root), "--task", lake.big)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == PREAMBLE.format(1000) + "".join(BIG[-1000:])
    whole = evagg("query", "logs", "--data", str(lake.root), "--task", lake.big, "--tail", "-1")
    assert whole.stdout.decode() == "".join(BIG)
    last = evagg("query", "logs", "--data", str(lake.root), "--task", lake.small, "--tail", "2")
    assert last.stdout.decode() == PREAMBLE.format(2) + "".join(SMALL[-2:])
    stderr = evagg("query", "logs", "--data", str(lake.root), "--task", lake.big, "--err",
                   "--tail", "-1")
    assert stderr.stdout.decode() == "".join(ERR)
    # its reported end is its start: nothing, not the next task's lines
    quiet = evagg("query", "logs", "--data", str(lake.root), "--task", lake.quiet, "--tail", "-1")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.decode() == "", quiet.stdout
    for stream in ([], ["--err"]):
        raised = evagg("query", "logs", "--data", str(lake.root), "--task", lake.raised,
                       *stream, "--tail", "-1")
        assert raised.returncode == 0, raised.stderr
        assert raised.stdout.decode() == "", raised.stdout


def test_a_task_whose_worker_died_names_the_workers_file_and_the_command_reads_it(
        lake: Lake) -> None:
    done = evagg("query", "logs", "--data", str(lake.root), "--task", lake.crashed)
    assert done.returncode == 1
    said = done.stderr.decode()
    assert "Ray named no log file for it" in said and "Traceback" not in said
    command = said.rsplit("evagg query logs ", 1)[1].split()
    assert command == ["--worker", lake.worker], said
    whole = evagg("query", "logs", "--data", str(lake.root), *command, "--tail", "2")
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.decode().endswith("".join(SMALL[-2:]))  # the file's last lines
    unknown = evagg("query", "logs", "--data", str(lake.root), "--worker", "ab" * 28,
                    "--session", SESSION)
    assert unknown.returncode == 1
    assert f"Worker {'ab' * 28} not found." in unknown.stderr.decode()


def test_an_actor_tasks_log_is_asked_of_its_actor_with_a_command_that_reads_the_lake(
        lake: Lake) -> None:
    done = evagg("query", "logs", "--data", str(lake.root), "--task", ACTOR_TASK)
    assert done.returncode == 1
    said = done.stderr.decode()
    assert f"please query actor log for actor({ACTOR}): e.g. evagg query logs --actor {ACTOR}" \
        in said, said
    assert "ray logs actor" not in said  # needs a live cluster's address


def test_query_logs_finds_the_session_that_ran_the_task(lake: Lake) -> None:
    # a newer cluster in the lake: the task is looked up where it ran, not in the newest
    done = evagg("query", "logs", "--data", str(lake.root), "--task", lake.small, "--tail", "-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(SMALL)
    # an id both clusters ran: which one is asked for, not guessed
    both = evagg("query", "logs", "--data", str(lake.root), "--task", task_hex(4))
    assert both.returncode == 2
    assert (f"task {task_hex(4)} is in 2 Ray sessions (Ray's clusters reuse ids): name one "
            f"(--session, or the dashboard's /ray/<session>/ address), newest first: "
            f"{LATER}, {SESSION}") in both.stderr.decode()
    one = evagg("query", "logs", "--data", str(lake.root), "--task", task_hex(4),
                "--session", SESSION[:20], "--tail", "-1")
    assert one.returncode == 0 and one.stdout.decode() == "".join(SMALL), one.stderr


def test_query_logs_says_what_is_missing(lake: Lake) -> None:
    done = evagg("query", "logs", "--data", str(lake.root), "--task", task_hex(9))
    assert done.returncode == 1
    assert b"Could not find log file for task" in done.stderr
    bad = evagg("query", "logs", "--data", str(lake.root), "--task", lake.big, "--tail", "0")
    assert bad.returncode == 2 and b"--tail" in bad.stderr


def test_a_lake_without_the_logs_says_which_lake_has_them(lake: Lake, tmp_path: Path) -> None:
    """A second Parquet sink's lake holds the events, never the logs (only the first
    sink's does): the answer names where they went."""
    second = tmp_path / "second"
    shutil.copytree(lake.root, second, ignore=shutil.ignore_patterns("_logs"))
    done = evagg("query", "logs", "--data", str(second), "--task", lake.big)
    assert done.returncode == 1
    said = done.stderr.decode()
    assert "did not collect it into this lake" in said, said
    assert "only into its first Parquet sink's lake" in said, said


@pytest.fixture(scope="module")
def dashboard_url(lake: Lake) -> Iterator[str]:
    store = Store(StoreOptions(location=str(lake.root)))
    with serving(store) as url:
        yield url
    store.close()


def ray_get_log(url: str, **options: object) -> str:
    """Ray's own client code, given the dashboard's URL."""
    code = ("import json, sys, ray.util.state.api as api; api.ray_address_to_api_server_url"
            " = lambda a: a; from ray.util.state import get_log; "
            "print(json.dumps(''.join(get_log(**json.loads(sys.argv[1])))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps({"address": url, **options})],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(json.loads(done.stdout))


def test_ray_get_log_reads_the_same_lines(lake: Lake, dashboard_url: str) -> None:
    assert ray_get_log(dashboard_url, task_id=lake.big) == "".join(BIG)  # tail -1: all
    assert ray_get_log(dashboard_url, task_id=lake.big, tail=1000) == "".join(BIG[-1000:])
    assert ray_get_log(dashboard_url, task_id=lake.small) == "".join(SMALL)
    assert ray_get_log(dashboard_url, task_id=lake.big, suffix="err") == "".join(ERR)
    everything = "".join(BIG + SMALL)
    assert ray_get_log(dashboard_url, node_id=NODE_HEX, filename=lake.worker_file) == everything
    assert ray_get_log(dashboard_url, node_id=NODE_HEX, pid=6001, tail=2) == "".join(SMALL[-2:])


def test_ray_logs_cli_through_the_documented_one_liner(lake: Lake, dashboard_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", ONE_LINER, dashboard_url, "logs", "task",
                           "--id", lake.small], capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ours = evagg("query", "logs", "--data", str(lake.root), "--task", lake.small)
    assert done.stdout == ours.stdout


def test_the_list_of_a_node_s_files_and_an_unknown_task(lake: Lake, dashboard_url: str) -> None:
    with urllib.request.urlopen(f"{dashboard_url}/api/v0/logs?node_id={NODE_HEX}&glob=*.out",
                                timeout=30) as answer:
        listed = json.loads(answer.read())
    assert listed["data"]["result"] == {"worker_out": [lake.worker_file]}
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{dashboard_url}/api/v0/logs/file?task_id={task_hex(9)}",
                               timeout=30)
    assert missing.value.code == 404
    assert b"Could not find log file for task" in missing.value.read()


