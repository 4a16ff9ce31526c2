"""Every configuration error names its key, says why, and exits non-zero."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.config import ConfigError, check_host, load_config
from aggregator.delivery.sink_set import build_sinks
from sinks.http import HttpSink
from sinks.parquet import ParquetSink
from sinks.parquet.s3 import S3Store
from tests.agentproc import REPO, short_socket_dir
from tests.commands import check_config

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
    "spool too small for a frame": (
        "[spool]\nmax_bytes = '16MiB'\n",
        "spool.max_bytes: 16MiB is less than eight times agent.max_frame (4MiB): set "
        "spool.max_bytes to at least 32MiB, or agent.max_frame to at most 2MiB"),
    "segment too small for a frame": (
        "[agent]\nmax_frame = '1MiB'\n[spool]\nsegment_bytes = '1536KiB'\n",
        "spool.segment_bytes: 1536KiB is less than twice agent.max_frame (1MiB): set "
        "spool.segment_bytes to at least 2MiB"),
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
                              "agent.http_token_file: cannot read the token file "
                              "/nonexistent/token"),
    "zero heartbeat interval": ("[agent]\nheartbeat_interval = '0s'\n",
                                "agent.heartbeat_interval: '0s' must be longer than zero"),
    "zero frame timeout": ("[agent]\nframe_timeout = 0\n",
                           "agent.frame_timeout: 0 must be longer than zero"),
    "zero frame size": ("[agent]\nmax_frame = 0\n",
                        "agent.max_frame: 0 must be larger than zero"),
    "zero body size": ("[agent]\nhttp_max_body = '0MiB'\n",
                       "agent.http_max_body: '0MiB' must be larger than zero"),
    "zero retry backoff": ("[[sinks]]\ntype='parquet'\nurl='/tmp/a'\nretry_max_backoff='0ms'\n",
                           "sinks[0].retry_max_backoff: '0ms' must be longer than zero"),
    "socket not a string": ("[agent]\nsocket = 5\n", "agent.socket: 5 is not a string"),
    "state_dir not a string": ("[agent]\nstate_dir = [1]\n",
                               "agent.state_dir: [1] is not a string"),
    "socket_group not a string": ("[agent]\nsocket_group = 0\n",
                                  "agent.socket_group: 0 is not a string"),
    # a sink's name names its dead-letter folder: '..' would be the state dir itself
    "sink named only dots": ("[[sinks]]\nname='..'\ntype='http'\nurl='http://x'\n",
                             "sinks[0].name: '..' must be 1-64 letters, digits, '.', '_' or "
                             "'-', not only dots"),
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


@pytest.mark.parametrize("name", ["..", "../elsewhere", "a/b"])
def test_dlq_refuses_a_sink_name_that_is_a_path(tmp_path: Path, name: str) -> None:
    """`evagg dlq list --sink NAME` lists the folder of that name: a name that is a path
    would list (or replay and delete) files elsewhere."""
    done = subprocess.run([sys.executable, "-m", "aggregator", "dlq", "list", "--sink", name],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "HOME": str(tmp_path), "EVAGG_CONFIG": ""})
    assert done.returncode == 2, done
    assert f"evagg dlq: --sink {name!r} must be 1-64 letters" in done.stderr


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


def test_check_config_names_every_header_it_cannot_resolve_and_a_missing_type(
        tmp_path: Path) -> None:
    # one run lists every problem: a second bad header is not left for the next run
    path = write(tmp_path, "[[sinks]]\ntype = 'http'\nurl = 'http://127.0.0.1:9/x'\n"
                           "headers = { Authorization = 'env:EVAGG_TEST_NO_SUCH_VAR', "
                           f"X-Tok = 'file:{tmp_path}/missing' }}\n"
                           "[[sinks]]\nname = 'untyped'\nurl = '/tmp/x'\n")
    result = check_config("--config", str(path))
    assert result.returncode == 2
    assert "'Authorization': environment variable EVAGG_TEST_NO_SUCH_VAR is not set" \
        in result.stderr
    assert f"'X-Tok': cannot read file {tmp_path}/missing" in result.stderr
    assert "sinks[1].type: required: one of " in result.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    local = GOOD.replace("s3://bucket/evagg/", str(tmp_path / "lake"))
    result = check_config("--config", str(write(tmp_path, local)))
    assert result.returncode == 0, result.stderr
    assert "config OK" in result.stdout


def test_drain_timeout_may_be_zero(tmp_path: Path) -> None:
    """"0s" means exit without waiting for the sinks: what they hold stays spooled."""
    config = load_config(write(tmp_path, "[agent]\ndrain_timeout = '0s'\n"), env={})
    assert config.drain_timeout_s == 0.0


def test_check_config_names_a_zero_interval(tmp_path: Path) -> None:
    result = check_config("--config", str(write(tmp_path, "[agent]\nheartbeat_interval = 0\n")))
    assert result.returncode == 2
    assert "agent.heartbeat_interval: 0 must be longer than zero" in result.stderr


def test_check_config_names_a_socket_that_is_not_a_string(tmp_path: Path) -> None:
    result = check_config("--config", str(write(tmp_path, "[agent]\nsocket = 5\n")))
    assert result.returncode == 2 and "agent.socket: 5 is not a string" in result.stderr
    assert "Traceback" not in result.stderr


# -- socket_group: checked against this host's groups, and again at start --------------------

MISSING_GROUP = "evagg-no-such-group"


def test_check_config_refuses_a_group_this_host_lacks(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        grp.getgrnam(MISSING_GROUP)
    path = write(tmp_path, f"[agent]\nsocket_group = '{MISSING_GROUP}'\n")
    result = check_config("--config", str(path))
    assert result.returncode == 2
    assert f"agent.socket_group: no group named '{MISSING_GROUP}'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_group_gone_by_start_is_a_clear_error(tmp_path: Path) -> None:
    """The group may vanish between the check and the start: `evagg run` says so, exits 1,
    and leaves no socket file (the check is bypassed here to reach the start)."""
    sock = short_socket_dir() / "events.sock"
    path = write(tmp_path, f"[agent]\nsocket = '{sock}'\nstate_dir = '{tmp_path}/state'\n"
                           f"http_listen = ''\nsocket_group = '{MISSING_GROUP}'\n"
                           f"[[sinks]]\nname = 'lake'\ntype = 'parquet'\nurl = '{tmp_path}/lake'\n")
    bypass = ("import sys, aggregator.config as c; c.check_host = lambda config: None; "
              "from aggregator.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", bypass, "run", "--config", str(path)],
                            cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1, result.stderr
    assert ("cannot start the agent: agent.socket_group: "
            f"no group named '{MISSING_GROUP}'") in result.stderr
    assert "Traceback" not in result.stderr
    assert not sock.exists()


def test_an_existing_group_passes(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    config = load_config(write(tmp_path, f"[agent]\nsocket_group = '{group}'\n"), env={})
    check_host(config)
    assert config.socket_group == group


# -- sink options: strict types, every error names the sink and the key ---------------------

PARQUET = "[[sinks]]\nname = 'lake'\ntype = 'parquet'\nurl = '{url}'\n"
HTTP = "[[sinks]]\nname = 'out'\ntype = 'http'\nurl = 'http://127.0.0.1:9/in'\n"
BAD_SINK_OPTIONS = {
    "roll_max_bytes": (PARQUET, "roll_max_bytes = 'abc'",
                       "sinks[0] (lake).roll_max_bytes: 'abc' is not a size"),
    "roll_interval": (PARQUET, "roll_interval = 'soon'",
                      "sinks[0] (lake).roll_interval: 'soon' is not a duration"),
    "zero roll_interval": (PARQUET, "roll_interval = '0s'",
                           "sinks[0] (lake).roll_interval: '0s' must be longer than zero"),
    "row_group_rows zero": (PARQUET, "row_group_rows = 0",
                            "sinks[0] (lake).row_group_rows: 0 must be at least 1"),
    "row_group_rows list": (PARQUET, "row_group_rows = [1]",
                            "sinks[0] (lake).row_group_rows: [1] is not a whole number"),
    "row_group_rows float": (PARQUET, "row_group_rows = 1.5",
                             "sinks[0] (lake).row_group_rows: 1.5 is not a whole number"),
    "multipart_threshold": (PARQUET.replace("{url}", "s3://bucket/p/"),
                            "multipart_threshold = 'abc'",
                            "sinks[0] (lake).multipart_threshold: 'abc' is not a size"),
    "path_style string": (PARQUET.replace("{url}", "s3://bucket/p/"), "path_style = 'false'",
                          "sinks[0] (lake).path_style: 'false' is not true or false"),
    "endpoint_url not a string": (PARQUET.replace("{url}", "s3://bucket/p/"),
                                  "endpoint_url = 5",
                                  "sinks[0] (lake).endpoint_url: 5 is not a string"),
    "batch_max_events": (HTTP, "batch_max_events = 'abc'",
                         "sinks[0] (out).batch_max_events: 'abc' is not a whole number"),
    "gzip string": (HTTP, "gzip = 'no'", "sinks[0] (out).gzip: 'no' is not true or false"),
    "gzip_level": (HTTP, "gzip_level = 12", "sinks[0] (out).gzip_level: 12 is not a zlib level"),
    "zero timeout": (HTTP, "timeout = '0s'", "sinks[0] (out).timeout: '0s' must be longer"),
    "max_in_flight float": (HTTP, "max_in_flight = 2.0",
                            "sinks[0] (out).max_in_flight: 2.0 is not a whole number"),
    "headers": (HTTP, "headers = 5", "sinks[0] (out).headers: must be a table"),
}


def sink_problems(tmp_path: Path, text: str) -> str:
    config = load_config(write(tmp_path, text.replace("{url}", str(tmp_path / "lake"))), env={})
    with pytest.raises(ConfigError) as caught:
        build_sinks(config.sinks, node_id="n", spool_id="s", state_dir=tmp_path / "state")
    return str(caught.value)


@pytest.mark.parametrize("case", sorted(BAD_SINK_OPTIONS))
def test_each_sink_option_error_names_its_key(tmp_path: Path, case: str) -> None:
    table, line, expected = BAD_SINK_OPTIONS[case]
    assert expected in sink_problems(tmp_path, f"{table}{line}\n")


def test_check_config_names_a_sink_option_of_the_wrong_type(tmp_path: Path) -> None:
    text = PARQUET.replace("{url}", str(tmp_path / "lake")) + "row_group_rows = [1]\n"
    result = check_config("--config", str(write(tmp_path, text)))
    assert result.returncode == 2
    assert "sinks[0] (lake).row_group_rows: [1] is not a whole number" in result.stderr
    assert "Traceback" not in result.stderr


def test_sink_options_of_the_right_type_are_used(tmp_path: Path) -> None:
    text = (PARQUET.replace("{url}", "s3://bucket/p/") + "path_style = true\nrow_group_rows = 500\n"
            + HTTP + "gzip = true\ngzip_level = 6\nmax_in_flight = 2\n")
    config = load_config(write(tmp_path, text), env={})
    built = dict((c.name, sink) for c, sink in build_sinks(
        config.sinks, node_id="n", spool_id="s", state_dir=tmp_path / "state"))
    lake, out = built["lake"], built["out"]
    assert isinstance(lake, ParquetSink) and isinstance(lake.store, S3Store)
    assert lake.row_group_rows == 500 and lake.store.path_style is True
    assert isinstance(out, HttpSink)
    assert (out.gzip, out.gzip_level, out.max_in_flight) == (True, 6, 2)


@pytest.mark.parametrize(("listen", "token", "warned"), [
    ("0.0.0.0:4040", False, True), ("10.0.0.7:4040", False, True),
    ("agent.example:4040", False, True), ("0.0.0.0:4040", True, False),
    ("127.0.0.1:4040", False, False), ("127.0.0.2:4040", False, False),
    ("[::1]:4040", False, False), ("localhost:4040", False, False), ("", False, False),
])
def test_a_port_beyond_loopback_without_a_token_is_a_warning(
        tmp_path: Path, listen: str, token: bool, warned: bool) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t0ken\n")
    text = f"[agent]\nhttp_listen = '{listen}'\n" + (
        f"http_token_file = '{token_file}'\n" if token else "")
    result = check_config("--config", str(write(tmp_path, text)))
    assert result.returncode == 0, result.stderr  # allowed: a warning, not an error
    assert ("config warning: agent.http_listen" in result.stderr) == warned
    assert ("anyone who reaches it can write events" in result.stderr) == warned


def test_a_bad_value_from_the_environment_names_its_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"EVAGG_HTTP_LISTEN": "nowhere"})
    assert str(caught.value).startswith("agent.http_listen (from $EVAGG_HTTP_LISTEN): ")
    with pytest.raises(ConfigError) as caught:  # a flag wins over the variable
        load_config(None, env={"EVAGG_HTTP_LISTEN": "127.0.0.1:1"},
                    overrides={"http_listen": "nowhere"})
    assert str(caught.value).startswith("agent.http_listen: ")
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, "[agent]\nhttp_listen = 'nowhere'\n"), env={})
    assert str(caught.value).startswith("agent.http_listen: ")


def test_a_smaller_max_frame_is_offered_only_where_producers_frames_still_fit(
        tmp_path: Path) -> None:
    """768KiB (or 0, for a spool of a few bytes) would refuse the library's 1MiB frames."""
    for spool in ("[agent]\nmax_frame = '1MiB'\n[spool]\nsegment_bytes = '1536KiB'\n",
                  "[spool]\nmax_bytes = '100'\n"):
        with pytest.raises(ConfigError) as refused:
            load_config(write(tmp_path, spool), env={})
        assert "agent.max_frame to at most" not in str(refused.value), str(refused.value)
