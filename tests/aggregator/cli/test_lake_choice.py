"""`evagg query`, `dashboard` and `export-traces` read the lake the agent's config names.

An operator on a node has the agent's config (/etc/evagg/evagg.toml), not its sink's url
in mind: `evagg status --config` prints the query that names the producers who lost
events, and that command, pasted as printed, must read the agent's lake, not the
operator's own (empty) data directory.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import orjson
import pytest

from tests.agentproc import AgentProcess
from tests.aggregator.cli.losing_producer import lose_three_events
from tests.aggregator.cli.newcomer import evagg


def _user_env(home: Path, **extra: str) -> dict[str, str]:
    """An operator's shell: an empty HOME, none of evagg's variables but `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local/share"), **extra}


def test_the_query_status_prints_reads_the_agents_lake_as_pasted(
        agent: AgentProcess, tmp_path: Path) -> None:
    lose_three_events(agent)
    env = _user_env(tmp_path / "home")
    status = evagg("status", "--config", str(agent.config_path), "--interval", "0.1", env=env)
    assert status.returncode == 0, status.stderr
    which = next(line for line in status.stdout.splitlines() if line.startswith("  which ones"))
    command = shlex.split(which.split("which ones", 1)[1])
    assert command[:4] == ["evagg", "query", "--config", str(agent.config_path)]
    agent.stop()
    answer = evagg(*command[1:], "--json", env=env)
    assert answer.returncode == 0, answer.stderr
    assert {(row["pid"], row["reason"], row["events"]) for row in orjson.loads(answer.stdout)
            } == {(os.getpid(), "unencodable", 1.0), (os.getpid(), "too_large", 2.0)}


def _config(path: Path, *lakes: str) -> Path:
    path.write_text("".join(f'[[sinks]]\nname = "lake{i}"\ntype = "parquet"\nurl = "{url}"\n'
                            for i, url in enumerate(lakes)))
    return path


def _lake_read(env: dict[str, str], *args: str) -> str:
    """The lake `evagg query ddl` says it reads (its first line names it)."""
    result = evagg("query", *args, "ddl", "--dialect", "duckdb", env=env)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    return first.split("over the lake ", 1)[1].rstrip(",").split(",")[0]


def test_explicit_flags_come_before_the_environment(tmp_path: Path) -> None:
    flag_lake, env_lake, config_lake = (tmp_path / n for n in ("flag", "env", "config"))
    for lake in (flag_lake, env_lake, config_lake):
        lake.mkdir()
    config = _config(tmp_path / "evagg.toml", str(config_lake))
    home = tmp_path / "home"
    assert _lake_read(_user_env(home), "--config", str(config)) == str(config_lake)
    assert _lake_read(_user_env(home, EVAGG_CONFIG=str(config))) == str(config_lake)
    both = _user_env(home, EVAGG_CONFIG=str(config), EVAGG_DATA=str(env_lake))
    assert _lake_read(both) == str(env_lake)
    assert _lake_read(both, "--config", str(config)) == str(config_lake)
    assert _lake_read(both, "--config", str(config), "--data", str(flag_lake)) == str(flag_lake)


@pytest.mark.parametrize(("lakes", "words"), [
    ((), "has no Parquet sink, so its agent writes no lake here: give --data"),
    (("/srv/a", "s3://bucket/b/"), "has 2 Parquet sinks (lake0: /srv/a, lake1: s3://bucket/b/): "
                                   "give --data with the one to read"),
])
def test_a_config_without_one_lake_says_what_to_give(
        tmp_path: Path, lakes: tuple[str, ...], words: str) -> None:
    config = tmp_path / "evagg.toml"
    if lakes:
        _config(config, *lakes)
    else:
        config.write_text('[[sinks]]\nname = "c"\ntype = "http"\nurl = "http://127.0.0.1:9/x"\n')
    env = _user_env(tmp_path / "home")
    for command in (("query", "--config", str(config), "summary"),
                    ("dashboard", "--config", str(config)),
                    ("export-traces", "--config", str(config), "--since", "1h")):
        result = evagg(*command, env=env)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert f"evagg {command[0]}: {config} {words}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_config_that_is_not_there_is_named(tmp_path: Path) -> None:
    result = evagg("query", "summary", "--config", str(tmp_path / "nope.toml"),
                   env=_user_env(tmp_path / "home"))
    assert result.returncode == 2
    assert f"evagg query: config file {tmp_path / 'nope.toml'} does not exist" in result.stderr


def test_ddl_s_lake_named_from_a_config_of_two_takes_that_sink_s_endpoint(
        tmp_path: Path) -> None:
    """`ddl` names its lake as an argument, where other queries take --data: one of the
    config's two lakes, named so, reads through that sink's endpoint as --data does."""
    from tests.sinks.moto_server import MotoS3, aws_env

    moto = MotoS3().start()
    try:
        bucket = moto.create_bucket()
        config = tmp_path / "evagg.toml"
        config.write_text(
            f'[[sinks]]\nname = "local"\ntype = "parquet"\nurl = "{tmp_path / "lake"}"\n'
            f'[[sinks]]\nname = "shared"\ntype = "parquet"\nurl = "s3://{bucket}/evagg/"\n'
            f'endpoint_url = "{moto.endpoint_url}"\npath_style = true\n')
        env = _user_env(tmp_path / "home", **aws_env())
        result = evagg("query", "ddl", "--dialect", "duckdb", f"s3://{bucket}/evagg/",
                       "--config", str(config), env=env)
    finally:
        moto.stop()
    assert result.returncode == 0, result.stderr
    assert "could not look for" not in result.stderr, result.stderr  # asked moto, not AWS
    assert f"127.0.0.1:{moto.port}" in result.stdout, result.stdout
