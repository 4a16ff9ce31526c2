"""The agent's log lines as JSON (`--log-format json`, `EVAGG_LOG_FORMAT=json`): every
line a real agent writes to stderr, from start to a SIGTERM drain, parses as one object;
a start that fails says why in the same format; a bad value is a clear error."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from aggregator.log_format import JsonLogFormatter
from tests.agentproc import REPO, AgentProcess


def json_lines(path: Path) -> list[dict[str, str]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # fails on any line that is not JSON


def test_a_real_agent_logs_one_json_object_per_line_from_start_to_drain(
        tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, env={"EVAGG_LOG_FORMAT": "json"}).start()
    assert agent.stop() == 0
    logged = json_lines(agent.log_path)
    assert any("evagg agent ready" in line["message"] for line in logged)
    assert {line["level"] for line in logged} <= {"DEBUG", "INFO", "WARNING", "ERROR"}
    assert all(line["time"].endswith("Z") and line["logger"] for line in logged)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **(env or {})})


def test_a_start_that_fails_says_why_in_json(tmp_path: Path) -> None:
    failed = run("run", "--log-format", "json", "--config", str(tmp_path / "missing.toml"))
    assert failed.returncode == 2
    (line,) = [json.loads(text) for text in failed.stderr.splitlines()]
    assert line["level"] == "ERROR" and "does not exist" in line["message"]


def test_a_bad_log_format_is_a_clear_error_and_text_stays_the_default(tmp_path: Path) -> None:
    refused = run("check-config", env={"EVAGG_LOG_FORMAT": "xml"})
    assert refused.returncode == 2
    assert "EVAGG_LOG_FORMAT: 'xml' is not one of text, json" in refused.stderr
    flag = run("run", "--log-format", "xml")
    assert flag.returncode == 2 and "invalid choice: 'xml'" in flag.stderr
    text = run("run", "--config", str(tmp_path / "missing.toml"))
    assert text.stderr.startswith("evagg: config error:")


def test_an_exception_keeps_its_traceback_inside_the_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("evagg.test", logging.ERROR, __file__, 1, "failed %s",
                                   ("once",), sys.exc_info())
    line = JsonLogFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed once" and "ValueError: boom" in parsed["exception"]


def test_warnings_and_uncaught_exceptions_are_json_lines_too(tmp_path: Path) -> None:
    """Python's warnings and a crash's traceback would otherwise be raw stderr text."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import threading, warnings\n"
        "from aggregator.log_format import configure_logging\n"
        "configure_logging(verbose=False, log_format='json')\n"
        "warnings.warn('deprecated thing')\n"
        "worker = threading.Thread(target=lambda: 1 / 0, name='worker')\n"
        "worker.start(); worker.join()\n"
        "raise RuntimeError('the end')\n")
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 1
    lines = [json.loads(text) for text in done.stderr.splitlines()]
    assert [line["level"] for line in lines] == ["WARNING", "CRITICAL", "CRITICAL"]
    assert "deprecated thing" in lines[0]["message"]
    assert "ZeroDivisionError" in lines[1]["exception"] and "worker" in lines[1]["message"]
    assert "RuntimeError: the end" in lines[2]["exception"]


def test_check_config_reports_in_json_too(tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"
    config.write_text('[agent]\nhttp_listen = "0.0.0.0:4040"\n')
    warned = run("check-config", "--log-format", "json", "--config", str(config),
                 env={"HOME": str(tmp_path)})
    assert warned.returncode == 0, warned.stderr
    (line,) = [json.loads(text) for text in warned.stderr.splitlines()]
    assert line["level"] == "WARNING" and "http_listen" in line["message"]
    config.write_text("[agent]\nnode_id = 5\n")
    refused = run("check-config", "--log-format", "json", "--config", str(config))
    assert refused.returncode == 2
    assert [json.loads(text)["level"] for text in refused.stderr.splitlines()] == ["ERROR"]



def test_under_systemd_each_line_carries_its_priority_for_the_journal(tmp_path: Path) -> None:
    """systemd connects stderr to the journal and names that stream in JOURNAL_STREAM:
    each line then leads with its syslog priority, so `journalctl -p warning` finds the
    warnings (the journal stamps the time itself)."""
    from tests.agentproc import http_sink
    from tests.waiting import wait_until

    agent = AgentProcess(tmp_path, sinks_toml=http_sink("collector", "http://127.0.0.1:9/x"),
                         drain_timeout="1s")  # the endpoint never answers
    agent.log_path.touch()
    found = agent.log_path.stat()
    agent.env = {"JOURNAL_STREAM": f"{found.st_dev}:{found.st_ino}"}
    agent.start()
    try:
        agent_emits_one(agent)
        wait_until(lambda: "<4>evagg" in agent.log(), 30,
                   lambda: f"a warning for the refused endpoint:\n{agent.log()}")
    finally:
        assert agent.stop() == 0
    lines = [line for line in agent.log().splitlines() if line.strip()]
    assert lines and all(line[:3] in ("<2>", "<3>", "<4>", "<6>", "<7>") for line in lines), \
        lines
    assert any(line.startswith("<6>evagg") and "evagg agent ready" in line for line in lines)


def agent_emits_one(agent: AgentProcess) -> None:
    from emitters import Emitter

    emitter = Emitter(socket=agent.socket_path)
    emitter.emit(kind="task", name="for-the-collector")
    emitter.flush(10)
    emitter.close(2.0)


def test_text_lines_elsewhere_keep_their_time(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, env={"JOURNAL_STREAM": "1:2"}).start()  # another stream
    assert agent.stop() == 0
    ready = next(line for line in agent.log().splitlines() if "evagg agent ready" in line)
    assert ready[:4].isdigit() and " INFO evagg" in ready, ready
