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


def test_a_token_file_every_user_may_read_is_a_warning(tmp_path: Path) -> None:
    """Another local user reads the token from a 0644 file and writes events with it."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    path = config(tmp_path, f'state_dir = "{tmp_path}/state"\nhttp_token_file = "{token}"')
    token.chmod(0o644)
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 0, checked.stderr
    assert (f"config warning: agent.http_token_file: {token} has mode 0644: every local "
            f"user can read (or change) the token") in checked.stderr
    assert f"chmod 600 {token}" in checked.stderr
    assert "s3cret" not in checked.stderr + checked.stdout
    for private in (0o600, 0o640):
        token.chmod(private)
        checked = evagg("check-config", "--config", str(path))
        assert "http_token_file" not in checked.stderr, checked.stderr


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


def test_an_s3_sink_s_bucket_is_tried_with_the_agent_s_credentials(tmp_path: Path) -> None:
    # what the agent would meet at its first upload, said before it starts: a warning
    # (the agent still starts and spools), and --offline for a config checked elsewhere
    from tests.sinks.moto_server import MotoS3, aws_env

    moto = MotoS3().start()
    try:
        def s3_sink(bucket: str) -> str:
            return (f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "s3://{bucket}/evagg/"\n'
                    f'endpoint_url = "{moto.endpoint_url}"\npath_style = true\n')

        missing = config(tmp_path, f'state_dir = "{tmp_path}/state"', s3_sink("no-such-bucket"))
        checked = evagg("check-config", "--config", str(missing), env=aws_env())
        assert checked.returncode == 0 and "config OK" in checked.stdout, checked.stderr
        warning = next(line for line in checked.stderr.splitlines() if "sinks[0]" in line)
        assert ("config warning: sinks[0] (lake): cannot list s3://no-such-bucket/evagg/ "
                "(s3_no_such_bucket)") in warning and "create the bucket" in warning
        assert "keeps events in its spool" in warning
        offline = evagg("check-config", "--config", str(missing), "--offline", env=aws_env())
        assert offline.returncode == 0 and "sinks[0]" not in offline.stderr, offline.stderr
        bucket = moto.create_bucket()
        present = config(tmp_path, f'state_dir = "{tmp_path}/state"', s3_sink(bucket))
        good = evagg("check-config", "--config", str(present), env=aws_env())
        assert good.returncode == 0 and "sinks[0]" not in good.stderr, good.stderr
        no_keys = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                   "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                   "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
        keyless = evagg("check-config", "--config", str(present), env=no_keys)
        assert keyless.returncode == 0 and "(s3_no_credentials)" in keyless.stderr, \
            keyless.stderr
        # an error elsewhere in the config: the bucket is still looked at, and said
        broken = config(tmp_path, f'state_dir = "{tmp_path}/state"\ndrain_timeout = "soon"',
                        s3_sink("no-such-bucket"))
        both = evagg("check-config", "--config", str(broken), env=aws_env())
        assert both.returncode == 2 and "agent.drain_timeout" in both.stderr, both.stderr
        assert "cannot list s3://no-such-bucket/evagg/ (s3_no_such_bucket)" in both.stderr
    finally:
        moto.stop()


def test_a_lake_directory_the_agent_cannot_write_is_named_before_it_starts(
        tmp_path: Path) -> None:
    lake = "/sys/evagg-lake"
    path = config(tmp_path, f'state_dir = "{tmp_path}/state"',
                  sinks=f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\n')
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 2, checked.stdout
    problem = next(line for line in checked.stderr.splitlines() if "sinks[0]" in line)
    assert f"sinks[0] (lake).url: the agent cannot write {lake} (nor create it in /sys)" \
        in problem, problem
    assert "ReadWritePaths=" in problem and "Errno" not in problem


def test_an_s3_endpoint_that_never_answers_is_tried_once_and_said(tmp_path: Path) -> None:
    """check-config runs before every start (ExecStartPre): an S3 that hangs gets one
    short try, not the sink's own retries, and a warning; the agent starts anyway."""
    import socket
    import threading

    from tests.sinks.moto_server import aws_env

    silent = socket.create_server(("127.0.0.1", 0))
    tries: list[socket.socket] = []
    threading.Thread(target=lambda: [tries.append(silent.accept()[0]) for _ in range(3)],
                     daemon=True).start()
    try:
        path = config(tmp_path, f'state_dir = "{tmp_path}/state"',
                      '[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "s3://b/evagg/"\n'
                      f'endpoint_url = "http://127.0.0.1:{silent.getsockname()[1]}"\n'
                      'path_style = true\n')
        checked = evagg("check-config", "--config", str(path), env=aws_env())
    finally:
        for held in tries:
            held.close()
        silent.close()
    assert checked.returncode == 0 and "config OK" in checked.stdout, checked.stderr
    assert "(s3_timeout)" in checked.stderr and "starts anyway" in checked.stderr
    assert len(tries) == 1, f"{len(tries)} tries"
