"""Another local user against the user's folder under /tmp.

Without XDG_RUNTIME_DIR (a batch job, a container, a cron job) a user's socket lives in
/tmp/evagg-<uid>, a name every user of the machine knows and may create first. Here a
second user does: the victim's producers must not send their events to that user's
socket, a driver asking for an agent on demand must not open the files that user
planted there (a symlink to the victim's own file), and `evagg run` must not serve from
there. Run as root, with two uids of their own; skipped otherwise."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import REPO
from tests.emitters.ondemand import agent_pids
from tests.ports import free_port

VICTIM, ATTACKER = 54321, 54322
SHARED = Path(f"/tmp/evagg-{VICTIM}")


def _victim_runs_python() -> bool:
    """Root, and an interpreter the victim may run (not one under root's 0700 home)."""
    if os.geteuid() != 0:
        return False
    try:
        return subprocess.run([sys.executable, "-c", "import orjson"], user=VICTIM,
                              group=VICTIM, extra_groups=[], cwd="/",
                              capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _victim_runs_python(),
                                reason="needs root and an interpreter other users may run")

PRODUCER = r"""
import emitters
emitters.emit(kind="task", name="secret-work", state="FINISHED", task_id="t1")
print("flushed" if emitters.flush(3) else "not flushed", flush=True)
"""
ON_DEMAND = r"""
import emitters
emitters.configure(start_agent=True)
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


def as_victim(home: Path, code: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVAGG_", "XDG_")) and k != "PYTHONPATH"}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO),
                "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}"})
    return subprocess.run([sys.executable, *code], cwd=REPO, env=env, user=VICTIM,
                          group=VICTIM, extra_groups=[], capture_output=True, text=True,
                          timeout=timeout)


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
    done = as_victim(victim_home, ["-c", PRODUCER])
    thief.join()
    listener.close()
    assert "not flushed" in done.stdout, done.stderr
    assert received == [], "the producer's events went to another user's socket"


def test_an_agent_on_demand_opens_nothing_another_user_planted(victim_home: Path) -> None:
    precious = victim_home / "precious"
    precious.write_text("the victim's own file\n")
    os.chown(precious, VICTIM, VICTIM)
    folder = attacker_folder()
    for planted in ("events.sock.http", "events.sock.agent.log", "events.sock.users"):
        os.symlink(precious, folder / planted)
        os.lchown(folder / planted, ATTACKER, ATTACKER)
    done = as_victim(victim_home, ["-c", ON_DEMAND])
    assert precious.read_text() == "the victim's own file\n"
    assert "no agent" in done.stdout, done.stdout + done.stderr
    assert f"{SHARED} belongs to uid {ATTACKER}, another user" in done.stderr


def test_evagg_run_will_not_serve_from_another_users_folder(victim_home: Path) -> None:
    attacker_folder()
    done = as_victim(victim_home, ["-m", "aggregator", "run"], timeout=30)
    assert done.returncode == 1, done.stderr
    assert f"{SHARED} belongs to uid {ATTACKER}, another user" in done.stderr
    assert not (SHARED / "events.sock").exists()
