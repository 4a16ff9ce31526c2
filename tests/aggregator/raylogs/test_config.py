"""`evagg check-config` knows the [ray] table: log_dir, an absolute path or "" (off)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.agentproc import REPO


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", "check-config", "--config",
                           str(config)], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=False)


def test_check_config_takes_ray_log_dir(tmp_path: Path) -> None:
    for value in ('"/tmp/ray"', '""'):
        config = tmp_path / "evagg.toml"
        config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n\n'
                          f"[ray]\nlog_dir = {value}\n")
        done = check(config)
        assert done.returncode == 0, done.stderr
        assert "config OK" in done.stdout


def test_check_config_names_every_ray_problem(tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"
    config.write_text('[ray]\nlog_dir = "relative/ray"\nlog_dri = "/tmp/ray"\n')
    done = check(config)
    assert done.returncode == 2
    assert "ray.log_dri: unknown key (did you mean 'log_dir'?" in done.stderr
    assert "ray.log_dir: 'relative/ray' is not an absolute path" in done.stderr
    config.write_text("[ray]\nlog_dir = 5\n")
    done = check(config)
    assert done.returncode == 2 and "ray.log_dir: must be a path" in done.stderr
