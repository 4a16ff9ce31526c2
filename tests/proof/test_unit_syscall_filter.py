"""The shipped unit's system call filter, applied to a real agent.

`systemd-analyze verify` and `security` read the unit; neither runs the agent under it.
Here the unit's deny list (`SystemCallFilter=~...`, its groups expanded by systemd's own
`systemd-analyze syscall-filter`) is loaded with libseccomp, with the unit's
`SystemCallErrorNumber=` (none: the process is killed, as systemd does), and the agent
runs under it: `check-config`, then `evagg run` collecting a Ray log (whose reader lowers
its thread's priority) and writing Parquet, then a clean stop. The allow list
(`@system-service`) is not emulated: it is systemd's own list for services.
"""

from __future__ import annotations

import configparser
import errno
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emitters import Emitter
from tests.agentproc import REPO, AgentProcess
from tests.aggregator.raylogs.lakefiles import shipped
from tests.aggregator.raylogs.rayevents import SESSION, post, running_event, task_hex
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze is not installed")


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string("\n".join(
        line.replace("SystemCallFilter=", f"SystemCallFilter{n}=", 1)
        for n, line in enumerate((REPO / "systemd" / "evagg.service").read_text().splitlines())))
    return parser["Service"]


def expand(name: str) -> set[str]:
    """A system call group (`@privileged`) as systemd lists it, nested groups expanded."""
    if not name.startswith("@"):
        return {name}
    listed = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True,
                            text=True, timeout=30, check=True).stdout.splitlines()[1:]
    found: set[str] = set()
    for line in (entry.strip() for entry in listed):
        if line and not line.startswith("#"):
            found |= expand(line)
    return found


def unit_filter() -> tuple[set[str], int]:
    """The unit's denied system calls, and the errno they fail with (0: killed)."""
    unit = service()
    denied: set[str] = set()
    for key, value in unit.items():
        if key.startswith("SystemCallFilter") and value.startswith("~"):
            for name in value[1:].split():
                denied |= expand(name)
    number = unit.get("SystemCallErrorNumber", "")
    return denied, getattr(errno, number) if number else 0


def filtered(denied: set[str], number: int, tmp_path: Path) -> list[str]:
    names = tmp_path / "denied.txt"
    names.write_text("\n".join(sorted(denied)))
    return [sys.executable, "-m", "tests.proof.seccomp_run", str(names), str(number), "--"]


def test_the_harness_kills_what_systemd_would_kill(tmp_path: Path) -> None:
    """Teeth: a denied call kills the process without an errno, and fails with one."""
    call = "import os; os.setpriority(os.PRIO_PROCESS, 0, 5); print('lived')"
    killed = subprocess.run([*filtered({"setpriority"}, 0, tmp_path), sys.executable, "-c",
                             call], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -31, killed  # SIGSYS
    refused = subprocess.run([*filtered({"setpriority"}, errno.EPERM, tmp_path),
                              sys.executable, "-c", call], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "PermissionError" in refused.stderr, refused


def test_the_agent_runs_and_collects_ray_logs_under_the_units_filter(tmp_path: Path) -> None:
    denied, number = unit_filter()
    assert "reboot" in denied, sorted(denied)  # the groups were expanded
    ray_root = tmp_path / "ray"
    logs = ray_root / SESSION / "logs"
    logs.mkdir(parents=True)
    out = logs / f"worker-{1:056x}-01000000-6001.out"
    out.write_text("printed by a task\n")
    work = tmp_path / "agent"
    work.mkdir()
    agent = AgentProcess(work, extra_toml=f'[ray]\nlog_dir = "{ray_root}"\n')
    prefix = filtered(denied, number, tmp_path)
    check = subprocess.run([*prefix, sys.executable, "-m", "aggregator", "check-config",
                            "--config", str(agent.config_path)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check
    agent.prefix = prefix
    agent.start()
    try:
        post(agent.http_url, [running_event(task_hex(1), str(out), str(out.with_suffix(".err")),
                                            ends=(out.stat().st_size, 0))])
        emitter = Emitter(socket=agent.socket_path)
        emitter.emit(kind="task", name="under-the-filter", state="FINISHED")
        assert emitter.flush(30)
        emitter.close(5.0)
        wait_until(lambda: shipped(agent.lake_dir, out.name) == out.read_bytes(), 60,
                   lambda: f"the Ray log in the lake:\n{agent.log()}")
        assert agent.stop() == 0, agent.log()
    finally:
        if agent.running:
            agent.kill()
    assert agent.query("SELECT count(*) FROM events WHERE name = 'under-the-filter'") == [(1,)]
    assert "Traceback" not in agent.log()
