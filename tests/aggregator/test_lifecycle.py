"""Reload, drain and startup failures of a real agent process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from tests.agentproc import REPO, AgentProcess, http_sink, query_lake, wait_tail_connected
from tests.aggregator.cli.newcomer import evagg
from tests.producers import producer_report, start_producer
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until

LAKE = '[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\nroll_interval = "1s"\n'


def sighup(agent: AgentProcess, logged: str) -> str:
    """Reload, and the log line containing `logged` the reload wrote: the reload builds the
    sinks first, which a busy machine can make take longer than any fixed wait."""
    assert agent.proc is not None
    before = len(agent.log().splitlines())
    agent.proc.send_signal(signal.SIGHUP)

    deadline = time.monotonic() + 30
    while not (written := [line for line in agent.log().splitlines()[before:]
                           if logged in line]):
        assert time.monotonic() < deadline, f"no {logged!r} within 30s:\n{agent.log()}"
        time.sleep(0.1)
    return written[0]


def test_reload_with_unbuildable_sinks_keeps_the_running_ones(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(sinks_toml=LAKE).start()
    good = agent.config_path.read_text()
    agent.config_path.write_text(good.replace('roll_interval = "1s"',
                                              'roll_interval = "1s"\nrow_group_rows = "many"'))
    refused = sighup(agent, "reload refused")
    assert agent.running
    assert "row_group_rows" in refused, refused
    # across 1,000 nodes a log line is missed: status and /metrics say it too
    status = evagg_status(agent)
    assert "the sinks above are the configuration before it" in status, status
    assert agent.metric('evagg_config_reloads_total{result="refused"}') == 1
    agent.config_path.write_text(good)
    sighup(agent, "reloaded: sinks")
    assert "config     " not in evagg_status(agent)
    assert agent.metric("evagg_config_reload_refused_timestamp_seconds") == 0
    assert producer_report(start_producer(agent.socket_path, "after-bad", 500))["flushed"]
    agent.wait_delivered(500)
    assert agent.stop() == 0
    assert agent.query("SELECT count(*) FROM events WHERE run_id = 'after-bad'") == [(500,)]


def evagg_status(agent: AgentProcess) -> str:
    done = subprocess.run([sys.executable, "-m", "aggregator", "status", "--url",
                           agent.http_url, "--interval", "0.1"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reload_keeps_command_line_flags_and_a_new_sink_gets_the_spools_history(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(sinks_toml=LAKE)
    agent.flags = ["--node-id", "flagged-node"]  # the config file says node_id = "test-node"
    second = agent.workdir / "second"
    agent.start()
    assert producer_report(start_producer(agent.socket_path, "before", 200))["flushed"]
    agent.wait_delivered(200)
    agent.config_path.write_text(agent.config_path.read_text() + "\n" + LAKE.replace(
        'name = "lake"', 'name = "second"').replace("{lake}", str(second)))
    reloaded = sighup(agent, "reloaded: sinks")  # the producer starts after the new sinks
    assert "lake -> " in reloaded and "second -> " in reloaded, reloaded
    assert producer_report(start_producer(agent.socket_path, "after", 300))["flushed"]
    agent.wait_delivered(500, sink="second")  # what the spool held before it, then the rest
    assert agent.stop() == 0
    wanted = [("after", "flagged-node", 300), ("before", "flagged-node", 200)]
    for lake in (agent.lake_dir, second):
        assert query_lake(lake, "SELECT run_id, node_id, count(*) FROM events WHERE kind = "
                          "'task' GROUP BY ALL ORDER BY run_id") == wanted


def test_a_reload_keeps_a_lagging_sinks_cursor(
        agent_factory: Callable[..., AgentProcess], servers: Callable[..., ServerThread]) -> None:
    """An endpoint that fails between successes, and a reload while it is down: the
    reload does not wait out drain_timeout for the endpoint (sighup's wait is far
    shorter), what it had is not sent again, what it lacks comes once it is back."""
    web = servers()
    agent = agent_factory(sinks_toml=LAKE + http_sink("collector", web.url),
                          drain_timeout="600s").start()
    assert producer_report(start_producer(agent.socket_path, "up", 100))["flushed"]
    agent.wait_delivered(100, sink="collector")
    web.stop()
    assert producer_report(start_producer(agent.socket_path, "down", 150))["flushed"]
    agent.wait_delivered(250)  # the lake has both; the collector is behind by 150 or more
    assert agent.metric('evagg_sink_lag_events{sink="collector"}') >= 150
    sighup(agent, "reloaded: sinks")
    assert agent.metric('evagg_sink_lag_events{sink="collector"}') >= 150
    web.start()
    agent.wait_delivered(250, sink="collector")
    assert agent.stop() == 0
    task_ids = [event["task_id"] for event in web.accepted_events()
                if event.get("kind") == "task"]
    # delivered before the reload: each once (a cursor moved back would send them again)
    assert sorted(t for t in task_ids if t.startswith("up-")) == sorted(
        f"up-{i}" for i in range(100))
    # the HTTP sink delivers at least once: a retry under load may repeat one of these
    assert {t for t in task_ids if t.startswith("down-")} == {f"down-{i}" for i in range(150)}


def test_an_open_tail_does_not_hold_the_exit(agent: AgentProcess) -> None:
    tail = subprocess.Popen([sys.executable, "-m", "aggregator", "tail", "--url",
                             agent.http_url], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_tail_connected(tail)  # else the stop would not test an open tail
        assert agent.stop(timeout=30) == 0  # aiohttp's default would wait 2 x 60 s
    finally:
        tail.kill()
        tail.wait()


def test_unbuildable_sinks_at_start_are_a_config_error(tmp_path: object) -> None:
    from pathlib import Path

    workdir = Path(str(tmp_path))
    config = workdir / "evagg.toml"
    config.write_text(f'[agent]\nsocket = "{workdir}/s.sock"\nstate_dir = "{workdir}/state"\n'
                      'http_listen = ""\n' + LAKE.replace("{lake}", str(workdir / "lake"))
                      + 'row_group_rows = "many"\n')
    result = subprocess.run([sys.executable, "-m", "aggregator", "run", "--config", str(config)],
                             cwd=REPO, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    assert "sinks[0] (lake)" in result.stderr and "Traceback" not in result.stderr


def test_a_second_agent_on_the_same_socket_says_why(agent: AgentProcess) -> None:
    result = subprocess.run([sys.executable, "-m", "aggregator", "run", "--socket",
                             str(agent.socket_path), "--state-dir",
                             str(agent.workdir / "other-state"), "--http-listen", ""],
                            cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert "cannot start the agent" in result.stderr and "already listening" in result.stderr


def test_a_sink_renamed_by_a_reload_leaves_status(
        agent_factory: Callable[..., AgentProcess], servers: Callable[..., ServerThread]) -> None:
    web = servers()
    agent = agent_factory(sinks_toml=LAKE + http_sink("collector", web.url)).start()
    assert producer_report(start_producer(agent.socket_path, "before", 20))["flushed"]
    agent.wait_delivered(20, sink="collector")
    text = agent.config_path.read_text()
    agent.config_path.write_text(text.replace('name = "collector"', 'name = "collector2"'))
    sighup(agent, "reloaded: sinks")
    status = evagg("status", "--url", agent.http_url, "--interval", "0.1")
    sinks = [line.split()[1] for line in status.stdout.splitlines() if line.startswith("sink ")]
    assert sorted(sinks) == ["collector2", "lake"], status.stdout
    assert "reloading: replacing the sinks with those of" in agent.log()
    assert agent.stop() == 0


def test_a_reload_says_which_changed_settings_wait_for_the_next_start(
        agent: AgentProcess) -> None:
    """A reload replaces the sinks only: a changed spool size or drain timeout in the file
    is said, not taken silently while status still shows the old one."""
    text = agent.config_path.read_text()
    agent.config_path.write_text(text.replace('drain_timeout = "20s"', 'drain_timeout = "5s"')
                                 .replace('max_bytes = "256MiB"', 'max_bytes = "128MiB"'))
    said = sighup(agent, "a reload replaces the sinks only")
    assert "agent.drain_timeout, spool.max_bytes changed in" in said, said
    assert "systemctl restart evagg" in said
    wait_until(lambda: "reloaded: sinks lake" in agent.log(), 30, agent.log)
    agent.config_path.write_text(text)  # back as it runs: nothing to say
    quiet = sighup(agent, "reloaded: sinks")
    assert "a reload replaces the sinks only" not in quiet
    assert agent.log().count("a reload replaces the sinks only") == 1


def test_a_restart_after_a_crash_says_what_the_spool_still_holds(
        agent_factory: Callable[..., AgentProcess]) -> None:
    import re

    from tests.ports import free_port

    agent = agent_factory(sinks_toml=http_sink(
        "collector", f"http://127.0.0.1:{free_port()}/ingest")).start()  # never delivers
    for n in range(3):
        assert evagg("emit", "--socket", str(agent.socket_path), "--name", f"e{n}").returncode == 0
    agent.kill()  # kill -9: no drain
    agent.start()
    wait_until(lambda: "resuming:" in agent.log(), 30, agent.log)
    resumed = next(line for line in agent.log().splitlines() if "resuming:" in line)
    found = re.search(r"collector ([\d,]+)", resumed)
    assert found and int(found[1].replace(",", "")) >= 3, resumed
