"""A real Ray head started with `ray start --head --block`, every port its own.

`ray.init()` cannot move the per-node agent's HTTP port (52365), and a second Ray on the
same machine then runs without it: no log service, so Ray's own log routes fail
("Agent for node id ... doesn't exist"). `ray start` takes every port as a flag.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.agentproc import REPO, AgentProcess
from tests.ports import free_port
from tests.raycli import RAY
from tests.waiting import wait_until

EXPORT_ENV = {"RAY_enable_core_worker_ray_event_to_aggregator": "1",
              "RAY_enable_ray_event": "1"}


@dataclass(frozen=True)
class RayHead:
    address: str  # the GCS, for ray.init(address=...)
    dashboard_url: str
    temp_dir: Path


@contextlib.contextmanager
def ray_head(env: dict[str, str], temp_dir: Path | None = None,
             num_cpus: int = 2) -> Iterator[RayHead]:
    """`temp_dir` is Ray's --temp-dir: when given, it stays after Ray stops (its files
    with it, as on a node); when not, one is made and removed after."""
    owned = temp_dir is None
    temp_dir = temp_dir or make_temp_dir()
    gcs, dashboard = free_port(), free_port()
    ports = {"--port": gcs, "--dashboard-port": dashboard,
             "--dashboard-agent-listen-port": free_port(),
             "--dashboard-agent-grpc-port": free_port(), "--node-manager-port": free_port(),
             "--object-manager-port": free_port(), "--runtime-env-agent-port": free_port(),
             "--metrics-export-port": free_port(), "--ray-client-server-port": free_port()}
    command = [RAY, "start", "--head", "--block", "--include-dashboard", "true",
               "--dashboard-host", "127.0.0.1", "--node-ip-address", "127.0.0.1",
               "--num-cpus", str(num_cpus), "--temp-dir", str(temp_dir),
               *(part for flag, port in ports.items() for part in (flag, str(port)))]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "disabled", **env}
    log = (temp_dir.parent / f"{temp_dir.name}.log").open("wb")
    proc = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_until(lambda: (temp_dir / "session_latest").exists() and _answers(dashboard),
                   120, "Ray's head to start")
        yield RayHead(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dashboard}", temp_dir)
    finally:
        _stop(proc)
        log.close()
        if owned:
            shutil.rmtree(temp_dir, ignore_errors=True)
        Path(log.name).unlink(missing_ok=True)


def make_temp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Unix socket paths: short


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=2):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """`ray start --block` stops its cluster on SIGTERM; whatever is left of the process
    group it started is killed by that group's id."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(60)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@contextlib.contextmanager
def ray_head_and_agent(agent_dir: Path) -> Iterator[tuple[AgentProcess, RayHead]]:
    """An agent whose [ray] log_dir is the Ray head's --temp-dir, and that head."""
    temp_dir = make_temp_dir()
    agent = AgentProcess(agent_dir, extra_toml=f'[ray]\nlog_dir = "{temp_dir}"\n').start()
    env = {**EXPORT_ENV, "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR":
           f"{agent.http_url}/ray/events"}
    try:
        with ray_head(env, temp_dir) as head:
            yield agent, head
    except BaseException:
        agent.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
