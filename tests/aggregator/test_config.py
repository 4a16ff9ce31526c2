"""Every configuration error names its key, says why, and exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.config import ConfigError, load_config
from tests.agentproc import REPO

GOOD = """
[agent]
node_id = "n1"
socket = "/tmp/evagg-test/events.sock"
state_dir = "/tmp/evagg-test/state"

[spool]
max_bytes = "1GiB"
when_full = "drop_oldest"
fsync = "always"

[[sinks]]
name = "lake"
type = "parquet"
url = "s3://bucket/evagg/"
roll_max_bytes = "128MiB"
roll_interval = "5m"

[[sinks]]
name = "collector"
type = "http"
url = "https://collector.example/ingest"
kinds = ["task", "op"]
"""

BAD = {
    "unknown top-level table": ("[agnet]\nnode_id = 'x'\n", "agnet: unknown key"),
    "unknown agent key": ("[agent]\nsockett = 'x'\n", "agent.sockett: unknown key"),
    "bad size": ("[spool]\nmax_bytes = 'lots'\n", "spool.max_bytes: 'lots' is not a size"),
    "bad policy": ("[spool]\nwhen_full = 'panic'\n", "spool.when_full: 'panic' is not one of"),
    "bad fsync": ("[spool]\nfsync = 'sometimes'\n", "spool.fsync"),
    "bad mode": ("[agent]\nsocket_mode = '999'\n", "agent.socket_mode"),
    "bad listen": ("[agent]\nhttp_listen = 'nowhere'\n", "agent.http_listen"),
    "bad duration": ("[agent]\ndrain_timeout = 'soon'\n", "agent.drain_timeout"),
    "unknown sink type": ("[[sinks]]\ntype = 'kafka'\nurl = 'x'\n",
                          "sinks[0].type: unknown sink type 'kafka'"),
    "s3 without bucket": ("[[sinks]]\ntype = 'parquet'\nurl = 's3:///prefix'\n",
                          "sinks[0].url: an s3 url needs a bucket"),
    "http sink without scheme": ("[[sinks]]\ntype = 'http'\nurl = 'collector:80'\n",
                                 "sinks[0].url: an http sink needs"),
    "missing url": ("[[sinks]]\ntype = 'http'\n", "sinks[0].url: required"),
    "unknown sink key": ("[[sinks]]\ntype = 'http'\nurl = 'http://x'\nretries = 3\n",
                         "sinks[0].retries: unknown key"),
    "duplicate sink names": ("[[sinks]]\nname='a'\ntype='parquet'\nurl='/tmp/a'\n"
                             "[[sinks]]\nname='a'\ntype='parquet'\nurl='/tmp/b'\n",
                             "sinks[1].name: 'a' is used by another sink"),
    "filters not a list": ("[[sinks]]\ntype='parquet'\nurl='/tmp/a'\nkinds='task'\n",
                           "sinks[0].kinds: must be a list of strings"),
    "not TOML": ("[agent\n", "is not valid TOML"),
    "unreadable token file": ("[agent]\nhttp_token_file = '/nonexistent/token'\n",
                              "agent.http_token_file: cannot read token file"),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "evagg.toml"
    path.write_text(text)
    return path


def test_good_config_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), env={})
    assert config.node_id == "n1"
    assert config.spool_max_bytes == 2**30
    assert config.spool_when_full == "drop_oldest" and config.spool_fsync == "always"
    assert [s.name for s in config.sinks] == ["lake", "collector"]
    assert config.sinks[1].kinds == ("task", "op")
    assert config.sinks[0].options["roll_max_bytes"] == "128MiB"


def test_environment_and_flags_override_the_file(tmp_path: Path) -> None:
    env = {"EVAGG_NODE_ID": "from-env", "EVAGG_SOCKET": "/tmp/env.sock"}
    config = load_config(write(tmp_path, GOOD), env=env, overrides={"socket": "/tmp/flag.sock"})
    assert config.node_id == "from-env"
    assert str(config.socket) == "/tmp/flag.sock"


def test_embedded_default_without_a_file() -> None:
    config = load_config(None, env={})
    assert [(s.name, s.type) for s in config.sinks] == [("lake", "parquet")]
    assert config.http_listen == "127.0.0.1:4040"
    assert os.access(config.socket.parent.parent, os.W_OK)


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_error_names_the_key(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), env={})
    assert expected in str(caught.value)


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", "check-config", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_check_config_exits_non_zero_with_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nsockett = 1\n[spool]\nmax_bytes = 'x'\n")
    result = check_config("--config", str(path))
    assert result.returncode == 2
    assert "agent.sockett: unknown key" in result.stderr
    assert "spool.max_bytes" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_config_missing_file(tmp_path: Path) -> None:
    result = check_config("--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_check_config_unreadable_header_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[[sinks]]\ntype = 'http'\nurl = 'http://127.0.0.1:9/x'\n"
                           f"headers = {{ Authorization = 'file:{tmp_path}/missing' }}\n")
    result = check_config("--config", str(path))
    assert result.returncode == 2
    assert "sinks[0]" in result.stderr and "missing" in result.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    local = GOOD.replace("s3://bucket/evagg/", str(tmp_path / "lake"))
    result = check_config("--config", str(write(tmp_path, local)))
    assert result.returncode == 0, result.stderr
    assert "config OK" in result.stdout
