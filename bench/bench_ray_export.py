"""Ray's own per-node agent against evagg's, on one Event Export stream, side by side.

A real local Ray head (`ray start --head`, its own ports and temp dir) exports events of
every type (`--types ALL`, as the issue measured; `--types default` for Ray's default,
which leaves out the task profile events) to a real evagg agent (Parquet sink in a temp
dir), as a node does in production:
Ray's core workers send their events over gRPC to Ray's per-node agent (the
`ray::DashboardAgent` process, which hosts Ray's event aggregator), and that agent POSTs
them as JSON to evagg's /ray/events. A driver then runs tiny tasks, and the CPU both
agents spend on them is read from /proc: from the first task until evagg has stored
every row (its count still for six seconds), less what each spends idle over the
same time (Ray's agent also polls the node's processes and metrics).

    .venv/bin/python bench/bench_ray_export.py [--tasks 5000] [--idle-seconds 10] [--types ALL]

The issue's target ("The two paths every node runs", item 1): evagg's CPU at most a tenth
of Ray's agent's on the same stream; the bench reports, it does not fail. Linux only
(/proc); it starts its agent and Ray with the test suite's helpers, so it needs the test
extras (the README's test command installs them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_ray_ingest import process_cpu  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402
from tests.rayexport import RAY_EXPORT_ENV  # noqa: E402
from tests.rayhead import make_temp_dir, ray_head  # noqa: E402

RAY_AGENT_TITLES = ("ray::DashboardAgent", "dashboard/agent.py")  # retitled once started
STORED = 'evagg_received_events_total{route="ray"'  # rows from Ray, not heartbeats


def ray_agent_pid(temp_dir: Path, timeout_s: float = 60.0) -> int:
    """The pid of Ray's per-node agent of the cluster whose temp dir is `temp_dir`: the
    raylet's child that calls itself ray::DashboardAgent."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        commands = _commands()
        raylets = {pid for pid, (_, command) in commands.items()
                   if "raylet" in command and str(temp_dir) in command}
        for pid, (parent, command) in commands.items():
            if parent in raylets and command.startswith(RAY_AGENT_TITLES):
                return pid
        time.sleep(0.5)
    raise SystemExit(f"no ray::DashboardAgent process of the Ray cluster in {temp_dir}")


def _commands() -> dict[int, tuple[int, str]]:
    """Each process's parent pid and command line, from /proc."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        found[int(proc.name)] = (parent, command)
    return found


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by role: the event loop (its main thread), and
    the others by name with their pool's number cut off (evagg-decode, asyncio, ...)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        role = "event loop" if task.name == str(pid) else name.rstrip("0123456789").rstrip("_-")
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        out[role] = out.get(role, 0.0) + seconds
    return out


class Clock:
    """CPU seconds of both agents since `reset()`, with the wall time."""

    def __init__(self, ray_cpu: Callable[[], float], evagg_cpu: Callable[[], float]) -> None:
        self.ray_cpu, self.evagg_cpu = ray_cpu, evagg_cpu
        self.reset()

    def reset(self) -> None:
        self.start = (time.monotonic(), self.ray_cpu(), self.evagg_cpu())

    def read(self) -> tuple[float, float, float]:
        wall, ray, evagg = self.start
        return time.monotonic() - wall, self.ray_cpu() - ray, self.evagg_cpu() - evagg


def run_tasks(tasks: int) -> None:
    """`tasks` tiny tasks on the cluster the driver joined, in waves of 1,000, as a
    driver submitting work over time does."""
    import ray

    @ray.remote
    def tiny(i: int) -> int:
        return i

    sent = 0
    while sent < tasks:
        wave = min(1000, tasks - sent)
        ray.get([tiny.remote(i) for i in range(sent, sent + wave)])
        sent += wave


def settle(agent: AgentProcess, quiet_s: float = 6.0, timeout_s: float = 120.0) -> int:
    """Wait until evagg's stored rows have not moved for `quiet_s` (Ray's agent sends a
    batch at least every second while it holds events); returns the rows stored. The
    agents' CPU is not waited on: Ray's keeps moving while idle."""
    deadline = time.monotonic() + timeout_s
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        now = agent.metric(STORED)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return int(now)
        time.sleep(0.5)
    raise SystemExit(f"evagg's stored rows still moved after {timeout_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--types", default="ALL",
                        help="the event types Ray's agent exports (its "
                             "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES): ALL, "
                             "as the issue measured, or 'default' for Ray's own default, "
                             "which leaves out TASK_PROFILE_EVENT")
    args = parser.parse_args()
    ray_temp = make_temp_dir()
    with tempfile.TemporaryDirectory(prefix="evagg-bench-") as workdir:
        # As docs/ray.md sets a node up: the lake with its default roll, and the agent
        # following Ray's log files under Ray's temp dir.
        agent = AgentProcess(Path(workdir), spool_toml='max_bytes = "8GiB"',
                             sinks_toml=f'[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                                        f'url = "{Path(workdir) / "lake"}"\n',
                             extra_toml=f'[ray]\nlog_dir = "{ray_temp}"\n').start()
        try:
            env = {**RAY_EXPORT_ENV,
                   "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR":
                       f"{agent.http_url}/ray/events"}
            if args.types != "default":
                env["RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES"] = args.types
            with ray_head(env, temp_dir=ray_temp) as head:
                measure(agent, head.address, head.temp_dir, args.tasks, args.idle_seconds)
        finally:
            agent.stop()
            shutil.rmtree(ray_temp, ignore_errors=True)


def join_cluster(address: str) -> None:
    """This process as the cluster's driver. The driver owns the tasks it submits, so it
    sends their lifecycle events itself: it needs Event Export turned on too."""
    import ray

    os.environ.update(RAY_EXPORT_ENV)
    ray.init(address=address, log_to_driver=False)


def measure(agent: AgentProcess, address: str, temp_dir: Path, tasks: int,
            idle_seconds: float) -> None:
    assert agent.proc is not None
    ray_cpu, evagg_cpu = process_cpu(ray_agent_pid(temp_dir)), process_cpu(agent.proc.pid)
    if ray_cpu is None or evagg_cpu is None:
        raise SystemExit("needs Linux's /proc")
    clock = Clock(ray_cpu, evagg_cpu)
    join_cluster(address)
    run_tasks(200)  # warm up: workers started, both agents past their imports
    settle(agent)
    clock.reset()
    time.sleep(idle_seconds)
    idle_wall, idle_ray_s, idle_evagg_s = clock.read()
    before = agent.metric(STORED)
    clock.reset()
    threads_before = threads_cpu(agent.proc.pid)
    run_tasks(tasks)
    stored = settle(agent) - int(before)
    wall, ray_s, evagg_s = clock.read()
    threads = {role: seconds - threads_before.get(role, 0.0)
               for role, seconds in threads_cpu(agent.proc.pid).items()}
    ray_net = ray_s - idle_ray_s / idle_wall * wall
    evagg_net = evagg_s - idle_evagg_s / idle_wall * wall
    print(f"{tasks:,} tiny tasks, {stored:,} rows stored by evagg, {wall:.1f} s until they "
          f"were; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'':16s}{'CPU s':>9s}{'idle CPU s/s':>14s}{'CPU s less idle':>17s}"
          f"{'per task':>11s}")
    for label, total, idle, net in (("Ray's agent", ray_s, idle_ray_s, ray_net),
                                    ("evagg's agent", evagg_s, idle_evagg_s, evagg_net)):
        print(f"{label:16s}{total:9.2f}{idle / idle_wall:14.3f}{net:17.2f}"
              f"{net / tasks * 1e6:8.0f} us")
    print("evagg's agent by thread, per task (idle included): " + ", ".join(
        f"{role} {seconds / tasks * 1e6:.0f} us"
        for role, seconds in sorted(threads.items(), key=lambda item: -item[1])
        if seconds / tasks * 1e6 >= 1))
    other = agent.metric('evagg_ray_careful_events_total{reason="other_event_type"')
    declined = agent.metric('evagg_ray_careful_events_total{reason="declined"')
    print(f"Ray events on evagg's careful path: {other:,.0f} of other types (jobs, nodes, "
          f"workers), {declined:,.0f} declined by the fast path")
    print(f"evagg / Ray's agent: {evagg_s / ray_s:.2f} of its CPU, {evagg_net / ray_net:.2f} "
          f"less idle (target: at most 0.10)")


if __name__ == "__main__":
    main()
