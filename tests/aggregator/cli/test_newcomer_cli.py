"""What a newcomer types and reads (issue 16, item 6), through the real `evagg` command:
exit codes, stdout and stderr."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.agentproc import REPO, AgentProcess, short_socket_dir
from tests.aggregator.cli.newcomer import evagg, evagg_command
from tests.ports import free_port
from tests.waiting import wait_until

NAN_PRODUCER = """
import sys
from emitters import Emitter

emitter = Emitter(socket=sys.argv[1], source="newcomer")
emitter.emit(kind="task", name="load_shard", state="FINISHED", task_id="t1", duration_s=0.8)
for step, loss in ((0, 0.5), (1, float("nan"))):
    emitter.emit(kind="op", name="forward", state="FINISHED", run_id="r1", step=step,
                 duration_s=0.01, metrics={"loss": loss})
emitter.emit(kind="op", name="save", state="FINISHED", duration_s=0.2)  # no run_id
# the torch tracker's train_step: its metrics, the loader's wait among them
emitter.emit(kind="op", name="train_step", state="FINISHED", run_id="r2", step=0,
             duration_s=0.01, metrics={"data_wait_s": 0.0001619, "grad_norm": 0.4661,
                                       "loss": 0.4592, "lr": 0.0010000000000000002})
assert emitter.flush(30.0)
"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake a real agent wrote: a task, a run whose step 1 lost its loss to NaN, and
    an op sent without a run_id."""
    agent = AgentProcess(tmp_path_factory.mktemp("lake-agent")).start()
    try:
        sent = subprocess.run([sys.executable, "-c", NAN_PRODUCER, str(agent.socket_path)],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        agent.wait_delivered(5)
    finally:
        assert agent.stop() == 0
    return agent.lake_dir


def query(lake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return evagg("query", "--data", str(lake), "--no-cache", *args)


# -- emit --------------------------------------------------------------------------------

def test_emit_without_an_agent_says_so_at_once(tmp_path: Path) -> None:
    missing = tmp_path / "no-agent.sock"
    done = evagg("emit", "--socket", str(missing), "--name", "smoke", "--state", "FINISHED",
                 env={"EVAGG_START_AGENT": ""})
    assert done.returncode == 1
    assert f"no agent is running on {missing}" in done.stderr
    assert "does not exist" in done.stderr and "evagg run" in done.stderr
    assert "did not acknowledge" not in done.stderr  # it did not wait for an ack


def test_emit_refuses_a_number_field_that_is_no_number(tmp_path: Path) -> None:
    done = evagg("emit", "--socket", str(tmp_path / "s.sock"), "--name", "x",
                 "--field", "duration_s=abc")
    assert done.returncode == 2
    # the agent's rule and words (docs/event-schema.md, "Bad input")
    assert "--field duration_s=abc: field 'duration_s' must be a number, got str" in done.stderr


def test_emit_takes_a_text_field_without_quotes(agent: AgentProcess) -> None:
    done = evagg("emit", "--socket", str(agent.socket_path), "--name", "visible_check",
                 "--state", "FINISHED", "--field", "task_id=vc1", "--field", "duration_s=8")
    assert done.returncode == 0, done.stderr
    agent.stop()
    assert agent.query("SELECT task_id, duration_s FROM events WHERE name = 'visible_check'"
                       ) == [("vc1", 8.0)]


def test_emit_of_a_state_evagg_does_not_rank_says_so_and_sends_it(agent: AgentProcess) -> None:
    sent = evagg("emit", "--socket", str(agent.socket_path), "--kind", "task", "--name",
                 "odd", "--state", "DONE", "--field", 'task_id="odd1"')
    assert sent.returncode == 0 and "sent 1 events" in sent.stdout
    assert "DONE is not a task state evagg knows (PENDING, SUBMITTED" in sent.stderr
    assert "shows such a task as UNKNOWN" in sent.stderr
    plain = evagg("emit", "--socket", str(agent.socket_path), "--kind", "task", "--name",
                  "odd", "--state", "FINISHED")
    assert plain.returncode == 0 and "note:" not in plain.stderr


def test_emit_help_explains_kind_name_and_state() -> None:
    shown = evagg("emit", "--help").stdout
    assert "what the event is: task, op" in shown
    assert "what it is called" in shown and "a task's state (PENDING" in shown


# -- the agent's ports and its config ----------------------------------------------------

def test_a_taken_http_port_says_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        sock = short_socket_dir() / "events.sock"
        done = evagg("run", "--socket", str(sock), "--state-dir", str(tmp_path / "state"),
                     "--http-listen", listen)
    assert done.returncode == 1
    assert f"cannot open the HTTP port {listen}: something is already listening" in done.stderr
    assert "--http-listen" in done.stderr and "Errno" not in done.stderr
    # a port the kernel hands out for outgoing connections (as bind(0) took this one)
    # may be held by one, which `ss -ltnp` does not show: said, with a port that does not
    assert "or an outgoing connection holds it" in done.stderr, done.stderr
    assert not sock.exists()  # nothing left behind


def test_check_config_lists_every_problem_and_suggests_the_key(tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"
    config.write_text('[agent]\nheartbeat_interval = "abc"\n\n[[sinks]]\nname = "lake"\n'
                      f'type = "parquet"\nurl = "{tmp_path}/lake"\nroll_intervall = "1m"\n'
                      'row_group_rows = "many"\n')
    done = evagg("check-config", "--config", str(config))
    assert done.returncode == 2
    problems = done.stderr.strip().splitlines()
    assert len(problems) == 3, done.stderr
    assert "agent.heartbeat_interval" in problems[0]
    assert "sinks[0].roll_intervall: unknown key (did you mean 'roll_interval'?" in problems[1]
    assert "row_group_rows: 'many' is not a whole number" in problems[2]


# -- help and version --------------------------------------------------------------------

def test_version_and_help_speak_to_users() -> None:
    version = evagg("--version")
    assert version.returncode == 0 and version.stdout.startswith("evagg ")
    top = evagg("--help").stdout
    assert "evagg run --demo" in top and "the modules it calls" not in top
    dashboard = evagg("dashboard", "--help").stdout
    assert "aiohttp" not in dashboard and "dashboard/web/app.py" not in dashboard
    assert "(default: 127.0.0.1:8050" in " ".join(dashboard.split())


@pytest.mark.parametrize("command", [("query", "tasks"), ("dashboard",), ("status",), ("run",)])
def test_a_wrong_flag_is_told_by_the_command_it_was_given_to(command: tuple[str, ...]) -> None:
    wrong = evagg(*command, "--bogus")
    assert wrong.returncode == 2
    named = " ".join(command)
    assert f"evagg {named}: error: unrecognized arguments: --bogus" in wrong.stderr
    assert f"usage: evagg {named} [-h]" in wrong.stderr  # its own options, not the top's
    assert "Traceback" not in wrong.stderr


@pytest.mark.parametrize(("typed", "meant"), [
    (("querry", "summary"), "query"), (("query", "summry"), "summary"),
    (("query", "tasks", "--sort", "duratoin"), "duration"), (("dashbord",), "dashboard")])
def test_a_typo_is_answered_with_the_nearest_choice(typed: tuple[str, ...], meant: str) -> None:
    wrong = evagg(*typed)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.rstrip().endswith(f"did you mean {meant!r}?"), wrong.stderr


def test_tail_says_what_it_waits_for(agent: AgentProcess) -> None:
    tail = subprocess.Popen([*evagg_command(), "tail", "--url", agent.http_url], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert tail.stderr is not None
        first = tail.stderr.readline()  # before any event came
        assert first.startswith(f"waiting for events on {agent.http_url}/v1/tail")
    finally:
        tail.kill()
        tail.wait()


# -- queries -----------------------------------------------------------------------------

def test_query_tasks_refuses_a_state_that_is_none(tmp_path: Path) -> None:
    done = query(tmp_path, "tasks", "--state", "DONE")
    assert done.returncode == 2
    assert "--state DONE: not a task state" in done.stderr
    assert "FINISHED, FAILED" in done.stderr


def test_query_tasks_fits_a_terminal_and_shows_every_column_on_request(lake: Path) -> None:
    narrow = query(lake, "tasks")
    assert narrow.returncode == 0, narrow.stderr
    assert "load_shard" in narrow.stdout
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 100, narrow.stdout
    wide = query(lake, "tasks", "--wide")
    assert "running_at" in wide.stdout and "error_message" in wide.stdout
    chosen = query(lake, "tasks", "--columns", "name,duration_s")
    assert chosen.stdout.split()[:2] == ["name", "duration_s"]
    wrong = query(lake, "tasks", "--columns", "name,colour")
    assert wrong.returncode == 2 and "colour" in wrong.stderr


def test_query_runs_names_the_run_of_ops_without_a_run_id(lake: Path) -> None:
    runs = query(lake, "runs")
    assert runs.returncode == 0, runs.stderr
    rows = [line for line in runs.stdout.splitlines()[2:] if line.strip()]
    assert any(row.startswith("r1 ") for row in rows), runs.stdout
    # the words the dashboard's Training runs page uses for the same row
    assert any(row.startswith("(ops without a run id) ") for row in rows), runs.stdout
    for name in ("(ops without a run id)", "", "(no run_id)"):  # the last: older scripts'
        steps = query(lake, "steps", "--run", name)
        assert steps.returncode == 0 and "save" in steps.stdout, (name, steps.stderr)


def test_query_steps_shows_a_nan_loss(lake: Path) -> None:
    steps = query(lake, "--json", "steps", "--run", "r1")
    assert steps.returncode == 0, steps.stderr
    rows = {row["step"]: row for row in orjson.loads(steps.stdout)}
    assert rows[1]["nonfinite"] == ["loss"] and rows[0]["nonfinite"] is None
    table = query(lake, "steps", "--run", "r1").stdout.splitlines()
    assert "nonfinite" in table[0] and "loss" in table[3], table


def test_query_steps_shows_every_metric_whole(lake: Path) -> None:
    """Four metrics run past the table's 60-character cut: the learning rate read
    `lr=0.…`, a number cut in two, where the Run page shows it whole."""
    steps = query(lake, "steps", "--run", "r2")
    assert steps.returncode == 0, steps.stderr
    assert ("data_wait_s=0.0001619, grad_norm=0.4661, loss=0.4592, lr=0.001"
            in steps.stdout), steps.stdout
    assert "…" not in steps.stdout


# -- the demo ----------------------------------------------------------------------------

def test_a_second_demo_shows_only_its_own_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVAGG_", "XDG_"))}
    env.update(HOME=str(tmp_path), XDG_RUNTIME_DIR=str(short_socket_dir()),
               EVAGG_HTTP_LISTEN=f"127.0.0.1:{free_port()}")
    for _ in range(2):
        done = evagg("run", "--demo", "40", env=env, inherit=False, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout.split("GROUP BY ALL ORDER BY kind, name, state;", 1)[1]
    assert "this demo is run demo-" in done.stdout and "earlier runs stay there" in done.stdout
    assert "heartbeat" not in table and "avg_ms" not in table
    assert re.search(r"task\s+│\s+preprocess\s+│\s+FINISHED\s+│\s+5\s+│", table), table
    assert " µs " in table or " ms " in table


def test_the_dead_letter_command_status_names_works_as_typed(tmp_path: Path) -> None:
    """An agent run with a config of its own (an HTTP sink beside the lake, state in the
    default place): `evagg status` says `(evagg dlq list --sink collector)`, and that
    command, typed as shown, lists the letters. It answered `no http sink named
    'collector' in the config`, exit 2, since it read no config; a replay, which needs the
    sink's url and headers, says which flag to add."""
    from tests.sinks.server_thread import ServerThread

    endpoint = ServerThread().start()
    endpoint.answer_always(400)
    config = tmp_path / "evagg.toml"
    config.write_text(f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{tmp_path / "lake"}"\n'
                      f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{endpoint.url}"\n'
                      'batch_interval = "50ms"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVAGG_", "XDG_"))}
    env.update(HOME=str(tmp_path), XDG_RUNTIME_DIR=str(short_socket_dir()),
               EVAGG_HTTP_LISTEN=f"127.0.0.1:{free_port()}", PYTHONPATH=str(REPO))
    agent = subprocess.Popen([*evagg_command(), "run", "--config", str(config)], cwd=REPO,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: evagg("status", env=env, inherit=False).returncode == 0, 60,
                   "the agent to answer")
        assert evagg("emit", "--kind", "task", "--name", "refused", env=env,
                     inherit=False).returncode == 0

        def status() -> str:
            return evagg("status", env=env, inherit=False).stdout
        wait_until(lambda: "dead letters:" in status(), 60, lambda: status())
        named = re.search(r"\((evagg dlq list --sink collector)\)", status())
        assert named is not None, status()
        listed = evagg(*named.group(1).split()[1:], env=env, inherit=False)
        assert listed.returncode == 0, listed.stderr
        assert "HTTP 400" in listed.stdout and "dead-lettered batches" in listed.stdout
        assert ("`evagg dlq replay --sink collector --config <the agent's config>` sends "
                "them again") in listed.stdout
        replay = evagg("dlq", "replay", "--sink", "collector", env=env, inherit=False)
        assert replay.returncode == 2
        assert ("pass the config the agent runs with: evagg dlq replay --sink collector "
                "--config FILE") in replay.stderr
    finally:
        agent.terminate()
        agent.wait(60)
        endpoint.close()


def test_a_relative_socket_and_state_dir_are_logged_where_they_are(tmp_path: Path) -> None:
    """`evagg run --socket ev.sock --state-dir st` logged `socket ev.sock`: a producer in
    another directory could not tell where to connect."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
           "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}"}
    agent = subprocess.Popen([*evagg_command(), "run", "--socket", "ev.sock", "--state-dir",
                              "st"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        assert agent.stdout is not None
        ready = next((line for line in agent.stdout if "evagg agent ready:" in line), "")
    finally:
        agent.terminate()
        agent.wait(60)
    assert f"socket {tmp_path}/ev.sock, " in ready, ready
    assert f"spool {tmp_path}/st/spool, " in ready, ready
