"""Another local user against the user's folder under /tmp.

Without XDG_RUNTIME_DIR (a batch job, a container, a cron job) a user's socket lives in
/tmp/evagg-<uid>, a name every user of the machine knows and may create first. Here a
second user does: the victim's producers must not send their events to that user's
socket, a driver asking for an agent on demand must not open the files that user
planted there (a symlink to the victim's own file), and `evagg run` must not serve from
there. Run as root, with two uids of their own; skipped otherwise."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

import emitters.autostart
from tests.agentproc import REPO
from tests.emitters.ondemand import agent_pids
from tests.ports import free_port

VICTIM, ATTACKER = 54321, 54322
SHARED = Path(f"/tmp/evagg-{VICTIM}")


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as two users")

PRODUCER = """
import emitters
emitter = emitters.Emitter()
emitter.emit(kind="task", name="secret-work", state="FINISHED", task_id="t1")
print("flushed" if emitter.flush(3) else "not flushed", flush=True)
"""
ON_DEMAND = """
import emitters
emitters.Emitter().configure(start_agent=True)
print("started" if emitters.autostart.current_lease() else "no agent", flush=True)
"""


@pytest.fixture
def victim_home() -> Iterator[Path]:
    """The victim's home, and a clean shared folder (removed again after)."""
    shutil.rmtree(SHARED, ignore_errors=True)
    home = Path(tempfile.mkdtemp(prefix="evagg-victim-"))
    os.chmod(home, 0o755)
    os.chown(home, VICTIM, VICTIM)
    yield home
    for pid in agent_pids(SHARED / "events.sock"):  # an agent the victim's driver started
        os.kill(pid, 9)
    shutil.rmtree(SHARED, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


def attacker_folder() -> Path:
    """The folder as the other user creates it first, open to the victim too (who then
    creates their files in it, and follows the other user's symlinks there)."""
    SHARED.mkdir()
    os.chmod(SHARED, 0o777)
    os.chown(SHARED, ATTACKER, ATTACKER)
    return SHARED


@dataclass
class Done:
    returncode: int
    output: str  # stdout and stderr together


def as_victim(home: Path, code: str, timeout: float = 60) -> Done:
    """Run `code` as the victim: in a forked child that became the victim's uid for good,
    so that it needs nothing it could not read itself (the interpreter may sit under
    root's own 0700 home) and runs the project's code as it is already loaded here."""
    with tempfile.TemporaryFile() as output:
        pid = os.fork()
        if pid == 0:  # the child: become the victim, run, exit without cleanup
            _run_as_victim(home, code, output.fileno(), timeout)
        deadline = time.monotonic() + timeout + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        output.seek(0)
        return Done(os.waitstatus_to_exitcode(done[1]), output.read().decode(errors="replace"))


def _run_as_victim(home: Path, code: str, output: int, timeout: float) -> NoReturn:
    status = 1
    try:
        os.dup2(output, 1)
        os.dup2(output, 2)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        logging.getLogger().handlers.clear()  # the test run's capture: the victim's own
        for name in [name for name in os.environ if name.startswith(("EVAGG_", "XDG_"))]:
            del os.environ[name]
        os.environ.update({"HOME": str(home), "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}"})
        os.chdir(home)
        # a new process has no agent leased, whatever tests this worker ran before (the
        # victim's code makes an emitter of its own: the default one may be theirs)
        emitters.autostart._lease = None
        os.setgroups([])
        os.setgid(VICTIM)
        os.setuid(VICTIM)
        signal.alarm(int(timeout))  # an agent that serves after all ends here
        try:
            exec(code, {"__name__": "victim"})
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os._exit(status)


def test_a_producer_sends_nothing_to_another_users_socket(victim_home: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(attacker_folder() / "events.sock"))
    os.chmod(SHARED / "events.sock", 0o777)
    listener.listen()
    listener.settimeout(8)
    received: list[bytes] = []

    def serve() -> None:
        try:
            peer, _ = listener.accept()
            peer.settimeout(5)
            received.append(peer.recv(65536))
        except OSError:
            pass

    thief = threading.Thread(target=serve)
    thief.start()
    done = as_victim(victim_home, PRODUCER)
    thief.join()
    listener.close()
    assert "not flushed" in done.output, done.output
    assert received == [], "the producer's events went to another user's socket"


def test_an_agent_on_demand_opens_nothing_another_user_planted(victim_home: Path) -> None:
    precious = victim_home / "precious"
    precious.write_text("the victim's own file\n")
    os.chown(precious, VICTIM, VICTIM)
    folder = attacker_folder()
    for planted in ("events.sock.http", "events.sock.agent.log", "events.sock.users"):
        os.symlink(precious, folder / planted)
        os.lchown(folder / planted, ATTACKER, ATTACKER)
    done = as_victim(victim_home, ON_DEMAND)
    assert precious.read_text() == "the victim's own file\n"
    assert "no agent" in done.output, done.output
    assert f"{SHARED} belongs to uid {ATTACKER}, another user" in done.output


def test_evagg_run_will_not_serve_from_another_users_folder(victim_home: Path) -> None:
    """The real command, as root here (the folder is neither root's nor its user's): the
    same check guards the /tmp/evagg-<uid> folder a user's agent picks by itself."""
    socket_path = attacker_folder() / "events.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVAGG_", "XDG_"))}
    env.update({"HOME": str(victim_home), "PYTHONPATH": str(REPO),
                "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}"})
    done = subprocess.run([sys.executable, "-m", "aggregator", "run", "--socket",
                           str(socket_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"{SHARED} belongs to uid {ATTACKER}, another user" in done.stderr
    assert not socket_path.exists()
