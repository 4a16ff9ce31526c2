"""Socket activation and sd_notify, without systemd: the test plays systemd.

It binds and listens on the Unix socket itself and hands it to the agent as fd 3 with
LISTEN_FDS=1 and LISTEN_PID=<the agent's pid> (a tiny launcher sets LISTEN_PID to its
own pid, then execs the agent, so the pid matches), and reads NOTIFY_SOCKET datagrams.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from emitters import wire
from tests.agentproc import REPO, AgentProcess, query_lake, short_socket_dir
from tests.producers import assert_exactly_once, producer_report, start_producer
from tests.proof import wait_until

LAUNCHER = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
"""


class ActivatedAgent(AgentProcess):
    """An agent started the way systemd starts it: socket passed in, readiness notified."""

    def __init__(self, workdir: Path, listener: socket.socket, notify_path: Path,
                 **kwargs: object) -> None:
        super().__init__(workdir, **kwargs)  # type: ignore[arg-type]
        self.listener = listener
        self.notify_path = notify_path

    def start(self, timeout: float = 30.0) -> AgentProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO), "NOTIFY_SOCKET": str(self.notify_path),
               **self.env}
        fd = self.listener.fileno()
        command = [sys.executable, "-c", LAUNCHER, str(fd), sys.executable, "-m", "aggregator",
                   "run", "--config", str(self.config_path)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=(fd,))
        self._wait_ready(timeout)
        return self


class Systemd:
    """What systemd holds for the service: the listening socket and the notify socket."""

    def __init__(self) -> None:
        folder = short_socket_dir()
        self.notify_path = folder / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(30)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.listener.bind(str(path))
        self.listener.listen(128)

    def next_state(self) -> dict[str, str]:
        """The next sd_notify datagram, as its KEY=value lines."""
        data = self.notify.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)

    def close(self) -> None:
        self.listener.close()
        self.notify.close()


@pytest.fixture
def systemd() -> Iterator[Systemd]:
    held = Systemd()
    yield held
    held.close()


@pytest.fixture
def activated(tmp_path: Path, systemd: Systemd) -> Iterator[Callable[..., ActivatedAgent]]:
    made: list[ActivatedAgent] = []

    def make(**kwargs: object) -> ActivatedAgent:
        agent = ActivatedAgent(tmp_path / "agent", systemd.listener, systemd.notify_path,
                               **kwargs)
        systemd.listen(agent.socket_path)
        made.append(agent)
        return agent

    (tmp_path / "agent").mkdir()
    yield make
    for agent in made:
        agent.kill()


def one_event_frame(name: str) -> bytes:
    return wire.encode_batch(os.urandom(16), 1, 1, orjson.dumps({"kind": "op", "name": name}))


def read_answer(sock: socket.socket) -> wire.Frame:
    buffer = wire.FrameBuffer()
    while (frame := buffer.pop()) is None:
        chunk = sock.recv(65536)
        assert chunk, "the agent closed the connection without an answer"
        buffer.feed(chunk)
    return frame


def test_ready_notified_events_on_the_passed_socket_land(
        activated: Callable[..., ActivatedAgent], systemd: Systemd) -> None:
    agent = activated()
    agent.start()
    assert systemd.next_state()["READY"] == "1"
    assert producer_report(start_producer(agent.socket_path, "act", 3000))["flushed"]
    agent.wait_delivered(3000)
    assert agent.stop() == 0
    assert systemd.next_state()["STOPPING"] == "1"
    assert agent.socket_path.is_socket()  # systemd's socket: the agent leaves it in place
    assert_exactly_once(agent.lake_dir, {"act": 3000})


def test_a_connection_made_while_the_agent_restarts_is_served_after(
        activated: Callable[..., ActivatedAgent], systemd: Systemd) -> None:
    agent = activated()
    agent.start()
    assert systemd.next_state()["READY"] == "1"
    producer = start_producer(agent.socket_path, "across", 20_000, seconds=4)
    received = 'evagg_received_events_total{route="socket"}'
    wait_until(lambda: agent.metric(received) >= 1000, 30, "the producer to be under way")
    agent.kill()  # the listening socket stays open in "systemd": connections queue
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waiting:
        waiting.settimeout(30)
        # connect() and sendall() returning is the condition: the connection waits in the
        # listening socket's queue, its frame in the kernel's buffer, before the agent starts
        waiting.connect(str(agent.socket_path))
        waiting.sendall(one_event_frame("sent-while-down"))
        agent.start()
        assert systemd.next_state()["READY"] == "1"
        answer = read_answer(waiting)
    assert isinstance(answer, wire.Ack) and answer.accepted == 1
    report = producer_report(producer)
    assert report["flushed"] and report["raised"] == 0
    agent.wait_delivered(1)
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {"across": 20_000})
    assert query_lake(agent.lake_dir, "SELECT count(*) FROM events "
                                      "WHERE name = 'sent-while-down'") == [(1,)]


def run_ids(lake: Path) -> set[str]:
    return {row[0] for row in query_lake(lake, "SELECT DISTINCT run_id FROM events "
                                               "WHERE kind = 'task'")}


def spool_identity(agent: AgentProcess) -> tuple[str, int]:
    spool = agent.state_dir / "spool"
    return (spool / "spool_id").read_text(), spool.stat().st_ino


def test_sighup_moves_the_sinks_and_leaves_socket_and_spool_alone(
        activated: Callable[..., ActivatedAgent], systemd: Systemd, tmp_path: Path) -> None:
    old_lake, new_lake = tmp_path / "old-lake", tmp_path / "new-lake"
    sinks = '[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{}"\nroll_interval = "1s"\n'
    agent = activated(sinks_toml=sinks.format(old_lake))
    agent.start()
    assert systemd.next_state()["READY"] == "1"
    assert producer_report(start_producer(agent.socket_path, "before", 2000))["flushed"]
    agent.wait_delivered(2000)
    spool_before, socket_before = spool_identity(agent), agent.socket_path.stat().st_ino

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:
        held.settimeout(30)
        held.connect(str(agent.socket_path))  # a producer connected across the reload
        agent.config_path.write_text(agent.config_path.read_text().replace(
            str(old_lake), str(new_lake)))
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloaded: sinks lake" in agent.log(), 30, agent.log)
        held.sendall(one_event_frame("on-the-held-connection"))
        assert isinstance(read_answer(held), wire.Ack)
    assert producer_report(start_producer(agent.socket_path, "after", 2000))["flushed"]

    agent.config_path.write_text("this is not TOML [")  # a bad reload changes nothing
    agent.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in agent.log(), 30, agent.log)
    assert producer_report(start_producer(agent.socket_path, "after-bad", 500))["flushed"]
    agent.wait_delivered(2000 + 1 + 2000 + 500)
    assert agent.stop() == 0

    assert spool_identity(agent) == spool_before
    assert agent.socket_path.stat().st_ino == socket_before
    assert_exactly_once(old_lake, {"before": 2000})
    assert_exactly_once(new_lake, {"after": 2000, "after-bad": 500})
    assert run_ids(old_lake) == {"before"}
    assert run_ids(new_lake) == {"after", "after-bad"}
    for lake, name, count in ((old_lake, "on-the-held-connection", 0),
                              (new_lake, "on-the-held-connection", 1)):
        assert query_lake(lake, f"SELECT count(*) FROM events WHERE name = '{name}'") == [
            (count,)]
