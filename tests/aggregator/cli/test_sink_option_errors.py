"""`evagg check-config`, `evagg run` and `evagg dlq replay` read an HTTP sink's options
through one parse: each refuses the same bad option, exit code 2, with the same message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agentproc import REPO
from tests.sinks.http_config_file import http_sink_config

URL = "https://127.0.0.1:9/ingest"  # never reached: every case is refused before a request
BAD = {  # case -> (the sink's TOML line, what all three commands say)
    "gzip_level": ("gzip_level = 12",
                   "sinks[0] (collector).gzip_level: 12 is not a zlib level from -1 to 9"),
    "batch_max_events": ("batch_max_events = 0",
                         "sinks[0] (collector).batch_max_events: 0 must be at least 1"),
    "tls_verify": ('tls_verify = "no"',
                   "sinks[0] (collector).tls_verify: 'no' is not true or false"),
    "header variable": ('headers = { X-Key = "env:EVAGG_TEST_NEVER_SET" }',
                        "sinks[0] (collector).headers: 'X-Key': environment variable "
                        "EVAGG_TEST_NEVER_SET is not set"),
    "tls file": ('tls_ca_file = "no-such-ca.pem"',
                 "sinks[0] (collector): tls_ca_file: cannot use no-such-ca.pem"),
    "proxy": ('proxy = "socks5://127.0.0.1:1080"', "sinks[0] (collector): proxy: must be"),
}


def evagg(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": str(REPO)})


def problems(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The config errors a command printed, without its own prefix."""
    return [line.split("config error: ", 1)[1] for line in done.stderr.splitlines()
            if "config error: " in line]


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_config_run_and_dlq_replay_refuse_a_bad_option_alike(
        tmp_path: Path, case: str) -> None:
    line, expected = BAD[case]
    config = str(http_sink_config(tmp_path, URL, line))
    commands = {
        "check-config": ("check-config", "--config", config),
        "run": ("run", "--config", config),
        "dlq replay": ("dlq", "replay", "--sink", "collector", "--config", config),
    }
    said = {}
    for name, args in commands.items():
        done = evagg(*args, cwd=tmp_path)
        assert done.returncode == 2, f"{name}: {done.stderr}"
        assert "Traceback" not in done.stderr
        said[name] = problems(done)
    assert said["check-config"] == said["run"] == said["dlq replay"], said
    assert len(said["run"]) == 1 and said["run"][0].startswith(expected)
