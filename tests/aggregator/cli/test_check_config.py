"""`evagg check-config` (and `evagg run`, which checks the same) as a user meets it:
a state_dir the agent cannot write, a token file that is not there, warnings beside
errors, and each problem said once."""

from __future__ import annotations

from pathlib import Path

from tests.aggregator.cli.newcomer import evagg
from tests.ports import free_port

# Not writable, and not creatable, whoever runs the tests (root included): sysfs.
UNWRITABLE = "/sys/evagg-state"


def config(tmp_path: Path, agent: str, sinks: str = "", listen: str = "") -> Path:
    sinks = sinks or f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{tmp_path}/lake"\n'
    path = tmp_path / "evagg.toml"
    path.write_text(f'[agent]\nsocket = "{tmp_path}/events.sock"\n'
                    f'http_listen = "{listen or f"127.0.0.1:{free_port()}"}"\n{agent}\n\n'
                    f"{sinks}")
    return path


def test_a_state_dir_the_agent_cannot_write_is_named_by_check_config_and_run(
        tmp_path: Path) -> None:
    path = config(tmp_path, f'state_dir = "{UNWRITABLE}"')
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 2, checked.stdout
    assert "config OK" not in checked.stdout
    problem = next(line for line in checked.stderr.splitlines() if "agent.state_dir" in line)
    assert f"the agent cannot write {UNWRITABLE}" in problem
    assert "--state-dir" in problem and "writable" in problem
    run = evagg("run", "--config", str(path), timeout=60)
    assert run.returncode == 2
    assert "agent.state_dir: the agent cannot write" in run.stderr
    assert "Errno" not in run.stderr and "Traceback" not in run.stderr
    writable = evagg("check-config", "--config", str(path), "--state-dir",
                     str(tmp_path / "state" / "new"))
    assert writable.returncode == 0, writable.stderr
    assert not (tmp_path / "state").exists(), "check-config must not create the state_dir"


def test_a_missing_token_file_is_named_by_its_path(tmp_path: Path) -> None:
    token = tmp_path / "no-such.token"
    path = config(tmp_path, f'state_dir = "{tmp_path}/state"\nhttp_token_file = "{token}"')
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 2
    assert (f"config error: agent.http_token_file: cannot read the token file {token}: "
            "No such file or directory") in checked.stderr


def test_warnings_show_beside_errors_and_a_bad_url_is_said_once(tmp_path: Path) -> None:
    path = config(tmp_path, f'state_dir = "{tmp_path}/state"', listen="0.0.0.0:4040",
                  sinks='[[sinks]]\nname = "c"\ntype = "http"\nurl = "ftp://example.com/x"\n')
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 2
    lines = checked.stderr.splitlines()
    assert any("config warning: agent.http_listen: 0.0.0.0:4040 can be reached from other "
               "hosts" in line for line in lines), checked.stderr
    about_url = [line for line in lines if "url" in line and "config error" in line]
    assert len(about_url) == 1, checked.stderr
    assert "sinks[0].url" in about_url[0]
