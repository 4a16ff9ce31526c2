"""The shipped systemd units: systemd's own verifier and security review, and the facts that
tie them to the agent's configuration. The Kubernetes manifests are in tests/deploy/.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from aggregator.config import load_config
from sinks.units import parse_duration

REPO = Path(__file__).resolve().parents[2]
UNITS = ("evagg.service", "evagg.socket")
MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 is locked down, 10 is exposed


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "systemd" / name)
    return parser


@pytest.fixture(scope="module")
def unit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A filesystem root for systemd-analyze: the system's own units, the commands the
    units run (the agent as a stub) and our units in /etc/systemd/system."""
    root = tmp_path_factory.mktemp("root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for command in ("/usr/local/bin/evagg", "/bin/kill"):
        path = root / command.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    target = root / "etc/systemd/system"
    target.mkdir(parents=True)
    for name in UNITS:
        shutil.copy(REPO / "systemd" / name, target / name)
    return root


def analyze(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args, f"--root={root}",
                           *[str(root / "etc/systemd/system" / name) for name in UNITS]],
                          capture_output=True, text=True, timeout=60, check=False)


def test_systemd_analyze_verify_is_clean(unit_root: Path) -> None:
    done = analyze(unit_root, "verify", "--man=no")
    # Unknown keys and bad values are warnings on stderr with exit status 0: demand silence.
    assert (done.returncode, done.stderr.strip(), done.stdout.strip()) == (0, "", "")


def test_systemd_analyze_verify_would_catch_a_typo(unit_root: Path, tmp_path: Path) -> None:
    """The check above has teeth: a misspelt directive is reported."""
    broken = tmp_path / "root"
    shutil.copytree(unit_root, broken, symlinks=True)
    service = broken / "etc/systemd/system/evagg.service"
    service.write_text(service.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    assert "Unknown key" in analyze(broken, "verify", "--man=no").stderr


def test_service_hardening_scores_ok(unit_root: Path) -> None:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                           f"--root={unit_root}",
                           str(unit_root / "etc/systemd/system/evagg.service")],
                          capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Overall exposure level for evagg.service: ([\d.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE


def test_units_agree_with_the_example_config(tmp_path: Path) -> None:
    config = load_config(REPO / "systemd" / "evagg.toml", env={})
    service, sock = unit("evagg.service"), unit("evagg.socket")
    assert sock["Socket"]["ListenStream"] == str(config.socket)
    assert int(sock["Socket"]["SocketMode"], 8) == config.socket_mode
    assert sock["Socket"]["SocketGroup"] == config.socket_group
    s = service["Service"]
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"  # READY=1 from the agent
    assert "HUP" in s["ExecReload"]
    assert parse_duration(s["TimeoutStopSec"] + "s") > config.drain_timeout_s
    assert s["StateDirectory"] == PurePosixPath(config.state_dir).name
    assert s["RuntimeDirectory"] == PurePosixPath(config.socket).parent.name
    assert s["RuntimeDirectoryPreserve"] == "yes"  # a restart must not delete the socket
    assert "evagg.socket" in service["Unit"]["Requires"]


def verify_user_unit(home: Path, unit_file: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze --user verify` as the user's own manager would load the unit."""
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return subprocess.run(["systemd-analyze", "--user", "verify", "--man=no", str(unit_file)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home),
                               "XDG_RUNTIME_DIR": str(runtime)})


def test_the_user_unit_verifies_for_a_user_with_evagg_in_local_bin(tmp_path: Path) -> None:
    """systemd/evagg-user.service, for a user without root (`systemctl --user`)."""
    command = tmp_path / ".local/bin/evagg"  # where `pip install --user` puts it
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    shipped = REPO / "systemd" / "evagg-user.service"
    done = verify_user_unit(tmp_path, shipped)
    assert (done.returncode, done.stderr.strip(), done.stdout.strip()) == (0, "", "")
    broken = tmp_path / "evagg-user.service"  # the check does see a mistake in it
    broken.write_text(shipped.read_text().replace("Restart=", "Restrat="))
    assert "Unknown key 'Restrat'" in verify_user_unit(tmp_path, broken).stderr
    service = unit("evagg-user.service")["Service"]
    system = unit("evagg.service")["Service"]
    for key in ("Type", "KillSignal", "TimeoutStopSec", "ExecReload"):
        assert service[key] == system[key], key  # stops and reloads as the system agent does
