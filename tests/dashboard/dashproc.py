"""A real `evagg dashboard` process on a free loopback port, for the tests that do what a
browser or a local user does against its port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.agentproc import REPO
from tests.ports import free_port
from tests.waiting import wait_until


@dataclass
class Dashboard:
    port: int
    pid: int  # the dashboard's own: a prefix execs it
    output: Path  # what it printed and logged

    def log(self) -> str:
        return self.output.read_text()


@contextmanager
def running_dashboard(lake: Path, workdir: Path, *args: str,
                      prefix: tuple[str, ...] = ()) -> Iterator[Dashboard]:
    """`evagg dashboard --data lake --no-cache` plus `args`, run under `prefix` (a command
    that lowers a limit, then execs); stopped with SIGTERM on exit. Its output goes to a
    file: a pipe nobody reads would stop it once its log filled the pipe."""
    port = free_port()
    output = workdir / "dashboard.log"
    with output.open("w") as sink:
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "aggregator", "dashboard",
                                 "--data", str(lake), "--no-cache", "--port", str(port),
                                 *args], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    try:  # it says where it serves once the port is open
        wait_until(lambda: f"127.0.0.1:{port}" in output.read_text() or proc.poll() is not None,
                   30, "the dashboard to serve")
        assert proc.poll() is None, output.read_text()
        yield Dashboard(port, proc.pid, output)
    finally:
        proc.terminate()
        proc.wait(30)
