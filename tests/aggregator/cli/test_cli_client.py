"""`evagg emit`, `evagg tail` and `evagg status` against a real agent."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

from tests.agentproc import REPO, AgentProcess, short_socket_dir, wait_tail_connected


def evagg(*args: str, stdin: bytes | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO, input=stdin,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_emit_from_flags_and_from_a_file(agent: AgentProcess, tmp_path: Path) -> None:
    sock = str(agent.socket_path)
    flags = evagg("emit", "--socket", sock, "--kind", "task", "--name", "smoke",
                  "--state", "FINISHED", "--field", "step=3", "--field", "note=hello")
    assert flags.returncode == 0, flags.stderr
    events = tmp_path / "events.ndjson"
    events.write_bytes(b'{"kind": "op", "name": "from-file", "step": 1}\n\n'
                       b'{"kind": "op", "name": "from-file", "step": 2}\n')
    from_file = evagg("emit", "--socket", sock, "--file", str(events))
    assert from_file.returncode == 0 and b"sent 2 events" in from_file.stdout
    piped = evagg("emit", "--socket", sock, "--file", "-", stdin=b'{"kind": "op", "name": "piped"}')
    assert piped.returncode == 0
    agent.stop()
    rows = agent.query("SELECT name, step, attrs['note'] FROM events WHERE kind IN ('task', 'op') "
                       "ORDER BY name, step")
    assert rows == [("from-file", 1, None), ("from-file", 2, None), ("piped", None, None),
                    ("smoke", 3, "hello")]


def test_emit_reports_bad_input_and_a_missing_agent(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ndjson"
    bad.write_bytes(b'{"kind": "op"}\n[1, 2]\n')
    result = evagg("emit", "--socket", str(tmp_path / "none.sock"), "--file", str(bad))
    # the good line 1 would be sent, but no agent listens: that is what the exit code says
    assert result.returncode == 1, result.stderr
    assert b"line 2: an event must be a JSON object, got list" in result.stderr
    missing = evagg("emit", "--socket", str(tmp_path / "none.sock"), "--timeout", "1")
    assert missing.returncode == 1 and b"the socket file does not exist" in missing.stderr
    stale = short_socket_dir() / "stale.sock"  # a socket file whose agent is gone
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(str(stale))
    unanswered = evagg("emit", "--socket", str(stale), "--timeout", "1")
    assert unanswered.returncode == 1
    assert b"nothing accepted a connection on" in unanswered.stderr
    assert b"is stopping (draining what it holds) or died and left its socket" \
        in unanswered.stderr


def test_tail_follows_new_events_filtered_by_kind(agent: AgentProcess) -> None:
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--url", agent.http_url,
                             "--kind", "task", "--json", "--limit", "2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_tail_connected(tail)  # a tail shows only what is spooled after it connected
    for name in ("first", "second"):
        assert evagg("emit", "--socket", str(agent.socket_path), "--kind", "op",
                     "--name", f"op-{name}").returncode == 0
        assert evagg("emit", "--socket", str(agent.socket_path), "--kind", "task",
                     "--name", name).returncode == 0
    out, _ = tail.communicate(timeout=30)
    lines = [orjson.loads(line) for line in out.splitlines()]
    assert [e["name"] for e in lines] == ["first", "second"]
    assert all(e["kind"] == "task" and e["pid"] > 0 for e in lines)


def test_tail_of_a_kind_no_evagg_producer_sends_says_so_and_follows_it(
        agent: AgentProcess) -> None:
    """`--kind ops` for `op` waited mutely for ever; a producer's own kind is followed."""
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--url", agent.http_url,
                             "--kind", "ops", "--kind", "task", "--limit", "1"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_tail_connected(tail)
    assert tail.stderr is not None
    said = tail.stderr.readline()
    assert said.startswith("evagg tail: no evagg producer sends kind 'ops' (evagg's own: "), said
    assert " op, " in said and "following it anyway" in said
    assert evagg("emit", "--socket", str(agent.socket_path), "--kind", "ops",
                 "--name", "mine").returncode == 0
    out, _ = tail.communicate(timeout=30)
    assert "  ops  mine  " in out, out


def test_tail_names_a_training_op_s_run_and_step(agent: AgentProcess) -> None:
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--url", agent.http_url,
                             "--kind", "op", "--limit", "2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_tail_connected(tail)
    for fields in (("run_id=lr-sweep-3", "step=1200"), ()):
        args = [arg for field in fields for arg in ("--field", field)]
        assert evagg("emit", "--socket", str(agent.socket_path), "--kind", "op",
                     "--name", "forward", *args).returncode == 0
    out, _ = tail.communicate(timeout=30)
    with_run, without = out.splitlines()
    assert "  forward  " in with_run and "  run=lr-sweep-3  step=1200  pid=" in with_run
    assert "run=" not in without and "step=" not in without


def test_tail_prints_an_error_s_type_once(agent: AgentProcess) -> None:
    """An OpenTelemetry span's message starts with its type (`ValueError: bad batch`), which
    tail printed as `ValueError: ValueError: bad batch`; a message without a type was not
    printed at all."""
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--url", agent.http_url,
                             "--kind", "task", "--limit", "3"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_tail_connected(tail)
    for name, fields in (
            ("typed", ("error_type=ValueError", "error_message=ValueError: bad batch")),
            ("plain", ("error_type=KeyError", "error_message=shard 7")),
            ("untyped", ("error_message=disk full",))):
        args = [arg for field in fields for arg in ("--field", field)]
        assert evagg("emit", "--socket", str(agent.socket_path), "--kind", "task", "--name", name,
                     "--state", "FAILED", *args).returncode == 0
    out, _ = tail.communicate(timeout=30)
    lines = {line.split("  ")[2]: line for line in out.splitlines()}
    assert "  ValueError: bad batch  " in lines["typed"] and "ValueError: Value" not in out
    assert "  KeyError: shard 7  " in lines["plain"]
    assert "  disk full  " in lines["untyped"]


def test_status_shows_rates_lag_and_spool(agent: AgentProcess) -> None:
    assert evagg("emit", "--socket", str(agent.socket_path), "--name", "s").returncode == 0
    text = evagg("status", "--url", agent.http_url, "--interval", "0.2")
    assert text.returncode == 0, text.stderr
    assert b"events/s" in text.stdout and b"sink lake" in text.stdout
    assert b"spool" in text.stdout
    as_json = orjson.loads(evagg("status", "--url", agent.http_url, "--interval", "0.2",
                                 "--json").stdout)
    assert as_json["spool_max_bytes"] == 256 * 2**20
    assert "lake" in as_json["lag_events"]


def test_status_counts_the_one_event_a_newcomer_sends(agent: AgentProcess) -> None:
    """Right after one test event the rate may read 0 events/s; the total says it came."""
    def received() -> float:
        found = evagg("status", "--url", agent.http_url, "--interval", "0.1", "--json")
        assert found.returncode == 0, found.stderr
        return float(orjson.loads(found.stdout)["received_total"])

    before = received()
    assert evagg("emit", "--socket", str(agent.socket_path), "--name", "hello").returncode == 0
    assert received() == before + 1  # the agent's own heartbeats are not counted
    text = evagg("status", "--url", agent.http_url, "--interval", "0.1").stdout.decode()
    assert f"{before + 1:,.0f} from producers since the agent started" in text


def test_status_without_an_agent_is_a_clear_error() -> None:
    for command in (("status", "--interval", "0.1"), ("tail",)):
        result = evagg(*command, "--url", "127.0.0.1:9")
        assert result.returncode == 1, result.stderr
        said = result.stderr.decode()
        assert "cannot reach the agent at http://127.0.0.1:9" in said
        assert "nothing answers there (connection refused)" in said and "evagg run" in said
        assert "urlopen error" not in said and "Traceback" not in said


def test_status_of_an_agent_that_accepts_but_never_answers_is_a_clear_error() -> None:
    # A stopped (SIGSTOP) or wedged agent: the kernel completes the connection, nothing reads.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        port = hung.getsockname()[1]
        result = evagg("status", "--interval", "0.1", "--url", f"127.0.0.1:{port}")
    said = result.stderr.decode()
    assert result.returncode == 1, said
    assert "Traceback" not in said, said
    assert f"cannot reach the agent at http://127.0.0.1:{port}" in said
    assert "did not answer in time" in said


# -- tail and status find the agent through its config, as `evagg run` does ----------------

def client_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def client(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          capture_output=True, timeout=60, env=env)


def test_status_reads_http_listen_from_config_and_environment(agent: AgentProcess,
                                                              tmp_path: Path) -> None:
    by_flag = client("status", "--config", str(agent.config_path), "--interval", "0.1",
                     "--json", env=client_env())
    assert by_flag.returncode == 0, by_flag.stderr
    assert "lake" in orjson.loads(by_flag.stdout)["lag_events"]
    by_variable = client("status", "--interval", "0.1",
                         env=client_env(EVAGG_CONFIG=str(agent.config_path)))
    assert by_variable.returncode == 0 and b"sink lake" in by_variable.stdout
    # As for `evagg run`, EVAGG_HTTP_LISTEN wins over the file.
    elsewhere = client("status", "--config", str(agent.config_path), "--interval", "0.1",
                       env=client_env(EVAGG_HTTP_LISTEN="127.0.0.1:9"))
    assert elsewhere.returncode == 1 and b"127.0.0.1:9" in elsewhere.stderr


def test_tail_reads_http_listen_from_evagg_config(agent: AgentProcess) -> None:
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--json", "--limit", "1",
                             "--kind", "task"],  # not the agent's heartbeat, due every 2 s
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=client_env(EVAGG_CONFIG=str(agent.config_path)))
    wait_tail_connected(tail)  # a tail shows only what is spooled after it connected
    assert evagg("emit", "--socket", str(agent.socket_path), "--name", "via-config").returncode == 0
    out, err = tail.communicate(timeout=30)
    assert tail.returncode == 0, err
    assert orjson.loads(out.splitlines()[0])["name"] == "via-config"


def test_tail_sends_the_token_the_agent_s_config_names(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-for-tail\n")
    agent = agent_factory(agent_toml=f'http_token_file = "{token}"').start()
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--json", "--limit", "1",
                             "--kind", "task", "--config", str(agent.config_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=client_env())
    wait_tail_connected(tail)
    assert evagg("emit", "--socket", str(agent.socket_path), "--name", "tokened").returncode == 0
    out, err = tail.communicate(timeout=30)
    assert tail.returncode == 0, err
    assert orjson.loads(out.splitlines()[0])["name"] == "tokened"


def test_emit_finds_the_agent_s_socket_in_its_config(agent: AgentProcess) -> None:
    # a newcomer with EVAGG_CONFIG set for `evagg status` expects `emit` to follow it too
    by_variable = client("emit", "--name", "via-config-file", "--timeout", "20",
                         env=client_env(EVAGG_CONFIG=str(agent.config_path)))
    assert by_variable.returncode == 0, by_variable.stderr
    by_flag = client("emit", "--config", str(agent.config_path), "--name", "via-flag",
                     "--timeout", "20", env=client_env())
    assert by_flag.returncode == 0, by_flag.stderr
    assert agent.stop() == 0
    assert sorted(agent.query("SELECT name FROM events WHERE name LIKE 'via-%'")) == [
        ("via-config-file",), ("via-flag",)]
    broken = client("emit", "--config", str(agent.workdir / "none.toml"), "--name", "x",
                    env=client_env())
    assert broken.returncode == 2 and b"evagg emit: config error" in broken.stderr


def test_status_with_http_disabled_or_a_broken_config_says_why(tmp_path: Path) -> None:
    off = tmp_path / "off.toml"
    off.write_text('[agent]\nhttp_listen = ""\n')
    disabled = client("status", "--config", str(off), env=client_env())
    assert disabled.returncode == 2 and b"HTTP port is disabled" in disabled.stderr
    missing = client("tail", "--config", str(tmp_path / "none.toml"), env=client_env())
    assert missing.returncode == 2 and b"does not exist" in missing.stderr
    assert b"Traceback" not in disabled.stderr + missing.stderr


def test_status_after_a_reload_refused_for_a_broken_file_says_how_to_ask_the_agent(
        agent: AgentProcess) -> None:
    # The agent refused the reload and runs on; the file on disk no longer parses. The
    # operator's next command must not be a dead end.
    broken = agent.workdir / "broken.toml"
    broken.write_text(agent.config_path.read_text() + "\n[[sinks\n")
    refused = client("status", "--interval", "0.1", env=client_env(EVAGG_CONFIG=str(broken)))
    assert refused.returncode == 2 and b"not valid TOML" in refused.stderr
    assert b"--url" in refused.stderr, refused.stderr
    asked = client("status", "--interval", "0.1", "--url", agent.http_url,
                   env=client_env(EVAGG_CONFIG=str(broken)))
    assert asked.returncode == 0 and b"sink lake" in asked.stdout, asked.stderr


# -- `evagg run --demo` next to a running agent ----------------------------------------------

def test_demo_beside_a_running_agent_says_why(agent: AgentProcess) -> None:
    """The README's first command, run twice: a clear message and exit 1, no traceback."""
    locked = client("run", "--demo", "10", "--config", str(agent.config_path), env=client_env())
    assert locked.returncode == 1
    assert b"cannot start the agent" in locked.stderr and b"in use" in locked.stderr
    assert b"stop that one first" in locked.stderr and b"--state-dir" in locked.stderr
    port_taken = client("run", "--demo", "10", "--config", str(agent.config_path),
                        "--state-dir", str(agent.workdir / "other-state"),
                        "--socket", str(agent.socket_path.parent / "other.sock"),
                        env=client_env())
    assert port_taken.returncode == 1
    assert b"cannot start the agent" in port_taken.stderr
    assert b"something is already listening on" in port_taken.stderr
    assert not (agent.socket_path.parent / "other.sock").exists()  # nothing left behind
    assert b"Traceback" not in locked.stderr + port_taken.stderr
    assert agent.running


def test_status_into_a_pipe_whose_reader_is_gone_ends_quietly(agent: AgentProcess) -> None:
    # `evagg status | head -1`: the reader may close before evagg writes; no traceback
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "aggregator", "status", "--url",
                               agent.http_url, "--interval", "0.1"], cwd=REPO, stdout=write,
                              stderr=subprocess.PIPE, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == b"", done.stderr  # 128 + SIGPIPE
