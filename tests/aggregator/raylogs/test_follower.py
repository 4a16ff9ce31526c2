"""The agent follows the log files Ray's events name and ships their bytes into the lake
while they grow: rotation, truncation, late and vanished files, symlinks, kills."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agentproc import AgentProcess
from tests.aggregator.raylogs.lakefiles import generations, shipped
from tests.aggregator.raylogs.rayevents import SESSION, post, running_event, task_hex
from tests.waiting import wait_until

Factory = Callable[..., AgentProcess]


@pytest.fixture
def ray_root(tmp_path: Path) -> Path:
    logs = tmp_path / "ray" / SESSION / "logs"
    logs.mkdir(parents=True)
    return tmp_path / "ray"


def logs_dir(ray_root: Path) -> Path:
    return ray_root / SESSION / "logs"


def follower_agent(agent_factory: Factory, ray_root: Path) -> AgentProcess:
    return agent_factory(extra_toml=f'[ray]\nlog_dir = "{ray_root}"\n').start()


def name_files(agent: AgentProcess, out: Path, n: int = 1) -> None:
    post(agent.http_url, [running_event(task_hex(n), str(out), str(out.with_suffix(".err")))])


def worker_file(ray_root: Path, n: int = 1) -> Path:
    return logs_dir(ray_root) / f"worker-{n:056x}-ffffffff-{6000 + n}.out"


def test_a_growing_file_is_shipped_while_it_grows(agent_factory: Factory,
                                                  ray_root: Path) -> None:
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    out.write_text("first line\n")
    name_files(agent, out)
    wait_until(lambda: shipped(agent.lake_dir, out.name) == b"first line\n", 60,
               "the first line in the lake")
    with out.open("a") as handle:
        handle.write("zweite Zeile, ünïcødé ✓\n")
    want = out.read_bytes()
    wait_until(lambda: shipped(agent.lake_dir, out.name) == want, 60,
               "the appended line in the lake")
    # The counter moves once the piece is published, just after a reader can see it.
    wait_until(lambda: agent.metric("evagg_ray_log_bytes_total") == len(want), 60,
               "the shipped bytes counted")
    assert agent.stop() == 0


def test_a_file_that_appears_after_the_event_naming_it(agent_factory: Factory,
                                                       ray_root: Path) -> None:
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    name_files(agent, out)
    wait_until(lambda: agent.metric("evagg_ray_log_bytes_total") == 0 and
               "ray-logs" in os.listdir(agent.state_dir), 30, "the follower to start")
    out.write_text("late\n")
    wait_until(lambda: shipped(agent.lake_dir, out.name) == b"late\n", 60, "the late file")


def test_rotation_keeps_both_generations(agent_factory: Factory, ray_root: Path) -> None:
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    out.write_text("old 1\n")
    name_files(agent, out)
    wait_until(lambda: shipped(agent.lake_dir, out.name) == b"old 1\n", 60, "old 1")
    with out.open("a") as handle:  # what Ray's rotation does: rename, then a new file
        handle.write("old 2\n")
        os.rename(out, f"{out}.1")
        out.write_text("new 1\n")
    wait_until(lambda: generations(agent.lake_dir, out.name) ==
               {0: b"old 1\nold 2\n", 1: b"new 1\n"}, 60,
               lambda: f"both generations, have {generations(agent.lake_dir, out.name)}")


def test_truncation_starts_a_new_generation(agent_factory: Factory, ray_root: Path) -> None:
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    out.write_text("before the truncation\n")
    name_files(agent, out)
    wait_until(lambda: shipped(agent.lake_dir, out.name) == b"before the truncation\n", 60,
               "the first generation")
    out.write_text("after\n")  # opened with O_TRUNC: same file, shorter
    wait_until(lambda: generations(agent.lake_dir, out.name).get(1) == b"after\n", 60,
               lambda: f"generation 1, have {generations(agent.lake_dir, out.name)}")


def test_a_file_deleted_before_it_was_read_is_a_loss_event(agent_factory: Factory,
                                                           ray_root: Path) -> None:
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    name_files(agent, out)  # named, and gone before the agent ever saw it
    loss = "SELECT sum(metrics['events']) FROM events WHERE kind = 'loss' AND name = '{}'"
    wait_until(lambda: any(agent.lake_dir.rglob("*.parquet")) and agent.query(loss.format(
        "ray_log_missing")) == [(2.0,)], 90, "a loss event for the .out and the .err")
    assert agent.metric('evagg_dropped_events_total{reason="ray_log_missing"}') == 2


def test_nothing_outside_log_dir_is_read(agent_factory: Factory, ray_root: Path,
                                         tmp_path: Path) -> None:
    secret = tmp_path / "secret.out"
    secret.write_text("not Ray's\n")
    link = worker_file(ray_root, 2)
    link.symlink_to(secret)
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    out.write_text("ray's\n")
    post(agent.http_url, [running_event(task_hex(1), str(secret), str(link)),
                          running_event(task_hex(2), str(link), str(out))])
    wait_until(lambda: shipped(agent.lake_dir, out.name) == b"ray's\n", 60, "the real file")
    wait_until(lambda: agent.metric("evagg_ray_log_refused_total") >= 2, 30,
               "the two refusals")
    # the link is named twice: a file is refused (and counted) once
    assert agent.metric("evagg_ray_log_refused_total") == 2
    kept = [str(piece) for piece in agent.lake_dir.rglob("*.zst")]
    assert kept and all(out.name in piece for piece in kept), kept


def test_every_byte_once_through_kills(agent_factory: Factory, ray_root: Path) -> None:
    agent = follower_agent(agent_factory, ray_root)
    out = worker_file(ray_root)
    out.write_text("")
    name_files(agent, out)
    stop = threading.Event()

    def write() -> None:
        with out.open("a", buffering=1) as handle:
            n = 0
            while not stop.is_set():
                handle.write(f"line {n} {'x' * (n % 200)}\n")
                n += 1
                if n % 100 == 0:  # about 1 MB/s
                    stop.wait(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for kills in range(3):
            wait_until(lambda: agent.metric("evagg_ray_log_pieces_total") > 0, 60,
                       f"pieces shipped before kill {kills + 1}")
            assert agent.proc is not None
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait()
            agent.proc = None
            agent.start()
    finally:
        stop.set()
        writer.join()
    want = out.read_bytes()
    wait_until(lambda: shipped(agent.lake_dir, out.name) == want, 90,
               lambda: f"{len(shipped(agent.lake_dir, out.name))} of {len(want)} bytes")
    assert agent.stop() == 0
