"""Hostile local clients: the pid and uid stored with an event are the kernel's (SO_PEERCRED),
whatever the payload claims, also for a client of another uid; and the socket's mode and
group keep out a user who is not in that group. The test runs as root and forks children
that drop to the 'nobody' user (uid and gid 65534).
"""

from __future__ import annotations

import errno
import grp
import os
import socket
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from emitters import wire
from tests.agentproc import AgentProcess
from tests.proof import wait_caught_up

NOBODY = 65534
OTHER_GROUP = "daemon"  # a group nobody is not in


def claim(name: str) -> bytes:
    """One event that lies about who sent it."""
    event = {"kind": "op", "name": name, "state": "FINISHED", "pid": 1, "uid": 0,
             "received": "2000-01-01T00:00:00Z"}
    return wire.encode_batch(os.urandom(16), 1, 1, orjson.dumps(event))


def send_frame(socket_path: Path, frame: bytes) -> str:
    """Connect, send one frame, return 'ack <accepted>', 'nack <reason>' or 'error <errno>'."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(socket_path))
            sock.sendall(frame)
            buffer = wire.FrameBuffer()
            while (answer := buffer.pop()) is None:
                chunk = sock.recv(65536)
                if not chunk:
                    return "closed"
                buffer.feed(chunk)
    except OSError as exc:
        return f"error {errno.errorcode.get(exc.errno or 0, exc.errno)}"
    if isinstance(answer, wire.Ack):
        return f"ack {answer.accepted}"
    return f"nack {getattr(answer, 'reason', answer)}"


def as_nobody(action: Callable[[], str], groups: tuple[int, ...] = ()) -> tuple[int, str]:
    """Run `action` in a forked child that became nobody; returns (child pid, its result)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges for good, act, report, exit without cleanup
        code = 0
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            assert os.getuid() == NOBODY and os.geteuid() == NOBODY
            os.write(write_end, action().encode())
        except BaseException as exc:
            os.write(write_end, f"child failed: {exc!r}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        result = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return pid, result


def socket_agent(factory: Callable[..., AgentProcess], agent_toml: str) -> AgentProcess:
    agent = factory(agent_toml=agent_toml)
    agent.socket_path.parent.chmod(0o755)  # others may reach the socket; its mode decides
    return agent.start()


def stored(agent: AgentProcess, name: str) -> tuple[int | None, int | None]:
    ((pid, uid),) = agent.query(f"SELECT pid, uid FROM events WHERE name = '{name}'")
    return pid, uid


def test_the_kernel_says_who_sent_an_event_not_the_payload(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = socket_agent(agent_factory, 'socket_mode = "0666"')
    child, result = as_nobody(lambda: send_frame(agent.socket_path, claim("from-nobody")))
    assert result == "ack 1"
    assert send_frame(agent.socket_path, claim("from-root-liar")) == "ack 1"
    wait_caught_up(agent, ["lake"], timeout=30)
    assert agent.stop() == 0
    assert stored(agent, "from-nobody") == (child, NOBODY)
    assert stored(agent, "from-root-liar") == (os.getpid(), 0)
    ((year,),) = agent.query("SELECT year(received) FROM events WHERE name = 'from-nobody'")
    assert year > 2000  # the agent stamps `received` too, whatever the payload said


def test_http_producers_cannot_claim_a_pid_or_uid(
        agent_factory: Callable[..., AgentProcess]) -> None:
    import urllib.request

    agent = socket_agent(agent_factory, "")
    body = orjson.dumps({"kind": "op", "name": "over-http", "pid": 1, "uid": 0})
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    wait_caught_up(agent, ["lake"], timeout=30)
    assert agent.stop() == 0
    assert stored(agent, "over-http") == (None, None)  # HTTP has no peer credentials


@pytest.mark.parametrize("member", [False, True], ids=["not-in-group", "in-group"])
def test_socket_mode_0660_keeps_out_users_outside_its_group(
        agent_factory: Callable[..., AgentProcess], member: bool) -> None:
    gid = grp.getgrnam(OTHER_GROUP).gr_gid
    agent = socket_agent(agent_factory,
                         f'socket_mode = "0660"\nsocket_group = "{OTHER_GROUP}"')
    mode = agent.socket_path.stat()
    assert (mode.st_mode & 0o777, mode.st_gid) == (0o660, gid)
    groups = (gid,) if member else ()
    child, result = as_nobody(lambda: send_frame(agent.socket_path, claim("guarded")), groups)
    if member:
        assert result == "ack 1"
        wait_caught_up(agent, ["lake"], timeout=30)
        assert agent.stop() == 0
        assert stored(agent, "guarded") == (child, NOBODY)
    else:
        assert result == "error EACCES"
        assert agent.stop() == 0
        assert agent.query("SELECT count(*) FROM events WHERE name = 'guarded'") == [(0,)]
