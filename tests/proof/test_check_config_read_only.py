"""`evagg check-config` where no temporary directory can be written, as in the DaemonSet.

The DaemonSet's init container runs `evagg check-config` with a read-only root
filesystem and only its config, token and state volumes: /tmp, /var/tmp and the working
directory are read-only there. Its look at an S3 sink's bucket (one listing) must not
need a temporary directory: it answers with the bucket's warning and exit 0, not a
FileNotFoundError that keeps every pod in Init.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.agentproc import REPO
from tests.sinks.moto_server import MotoS3, aws_env


def read_only_tmp(command: list[str], writable: Path) -> str:
    """A shell line for a mount namespace of its own: /tmp and /var/tmp read-only (their
    files still there), `writable` a fresh tmpfs, run from read-only /tmp."""
    steps = [f"mount --bind {d} {d} && mount -o remount,bind,ro {d}" for d in ("/tmp", "/var/tmp")]
    steps += [f"mount -t tmpfs tmpfs {shlex.quote(str(writable))}", "cd /tmp",
              "exec " + shlex.join(command)]
    return " && ".join(steps)


def test_check_config_looks_at_the_bucket_without_a_temporary_directory(tmp_path: Path) -> None:
    moto = MotoS3().start()
    try:
        state = tmp_path / "state"  # the DaemonSet's state volume: the one writable folder
        state.mkdir()
        config = tmp_path / "evagg.toml"
        config.write_text(
            f'[agent]\nsocket = "{tmp_path}/run/events.sock"\nstate_dir = "{state}"\n'
            'http_listen = ""\n\n[[sinks]]\nname = "lake"\ntype = "parquet"\n'
            f'url = "s3://no-such-bucket/evagg/"\nendpoint_url = "{moto.endpoint_url}"\n'
            'path_style = true\n')
        check = [sys.executable, "-m", "aggregator", "check-config", "--config", str(config)]
        env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             read_only_tmp(check, state)],
            env={**env, **aws_env(), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True, text=True, timeout=120)
    finally:
        moto.stop()
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "uncaught" not in done.stderr, done.stderr
    assert "cannot list s3://no-such-bucket/evagg/ (s3_no_such_bucket)" in done.stderr
    assert "create the bucket, or fix the sink's url" in done.stderr
    assert done.stdout.lower().startswith("config ok"), done.stdout
