"""Agent on demand: a driver starts the node's agent when none answers, and the agent
leaves once the last process that asked for it is gone.

    emitters.configure(start_agent=True)     # or EVAGG_START_AGENT=1 in the environment

Two lock files beside the socket make this race-free without a daemon manager:

- `<socket>.start`: an exclusive flock, held while a process checks for an agent and,
  if none answers, starts one and waits for it. Of drivers starting at once, one starts
  the agent; the others wait for the lock, then find it answering.
- `<socket>.users`: every process that asked holds a shared flock on it for its lifetime
  (the kernel drops it when the process ends, crash or not). The agent, started with
  `--exit-when-unused <socket>.users`, polls for an exclusive flock; once it gets one, no
  user is left: it keeps that lock, drains and exits. A process that asks meanwhile
  blocks on its shared lock until the old agent is gone, then starts a fresh one.

The agent runs in its own session (`start_new_session`), so a driver's crash or a
Ctrl-C in its terminal does not take it down. Its HTTP port is chosen free and exported
to workers as OTEL_EXPORTER_OTLP_ENDPOINT (emitters/agent_http.py). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from emitters import agent_http, paths

log = logging.getLogger("evagg.autostart")

START_TIMEOUT_S = 30.0  # for a started agent to answer on its socket
LOCK_TIMEOUT_S = 120.0  # for a draining agent to leave (its drain deadline and some)
POLL_S = 0.05
ENV_START = "EVAGG_START_AGENT"


@dataclass(frozen=True, slots=True)
class AgentLease:
    """This process's use of an agent; the shared users lock lives as long as the process."""

    socket_path: str
    started: bool  # this process started the agent
    pid: int | None  # the agent's pid when this process started it
    http: str | None = None  # host:port where the agent answers HTTP; "": it has none;
    # None: not known (an agent no driver started, such as a system one)


_guard = threading.Lock()
_lease: AgentLease | None = None
_users_fd: int | None = None  # kept open (never closed) so the shared lock lasts


def users_lock_path(socket_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(socket_path)}.users")


def start_lock_path(socket_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(socket_path)}.start")


def agent_log_path(socket_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(socket_path)}.agent.log")


def agent_answers(socket_path: str | os.PathLike[str], timeout: float = 1.0) -> bool:
    """Whether an agent accepts connections on the socket now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(timeout)
        probe.connect(os.fspath(socket_path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def choose_socket(explicit: str | None) -> Path:
    """The configured socket, else $EVAGG_SOCKET, else a live system agent, else the user's."""
    if explicit:
        return Path(explicit)
    if os.environ.get("EVAGG_SOCKET"):
        return Path(os.environ["EVAGG_SOCKET"])
    if agent_answers(paths.SYSTEM_SOCKET):
        return paths.SYSTEM_SOCKET
    return paths.user_socket_path()


def ensure_agent(socket_path: str | None = None, *, start_timeout: float = START_TIMEOUT_S,
                 lock_timeout: float = LOCK_TIMEOUT_S) -> AgentLease | None:
    """Use the agent on the socket, starting one if none answers; None if that failed.

    Exports EVAGG_SOCKET (and EVAGG_START_AGENT=1, so that the workers this process
    starts also count as users) into os.environ. Never raises; failures are logged.
    """
    global _lease
    with _guard:
        try:
            path = choose_socket(socket_path)
            if _lease is not None and _lease.socket_path == str(path):
                return _lease
            lease = _ensure(path, start_timeout, lock_timeout)
        except Exception:
            log.exception("evagg: could not check or start an agent")
            return None
        if lease is not None:
            _lease = lease
            os.environ["EVAGG_SOCKET"] = lease.socket_path
            os.environ[ENV_START] = "1"
            agent_http.export(lease.http)
        return lease


def current_lease() -> AgentLease | None:
    """The lease this process holds (inherited by a forked child), if any."""
    return _lease


def _ensure(path: Path, start_timeout: float, lock_timeout: float) -> AgentLease | None:
    global _users_fd
    deadline = time.monotonic() + lock_timeout
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = paths.unsafe_directory(path.parent)
        if problem:  # before any file is opened there: another user's symlinks
            log.warning("evagg: not using or starting an agent on %s: %s; set "
                        "EVAGG_SOCKET or XDG_RUNTIME_DIR to a folder of your own", path, problem)
            return None
        users = _open_lock(users_lock_path(path))
    except OSError as exc:  # a system socket's directory: use the agent if it is there
        if agent_answers(path):
            return AgentLease(str(path), False, None)
        log.warning("evagg: no agent on %s and cannot start one there: %s", path, exc)
        return None
    if not _lock(users, fcntl.LOCK_SH, deadline):
        os.close(users)
        log.warning("evagg: the agent on %s is still draining after %.0fs", path, lock_timeout)
        return None
    got = _start_if_absent(path, deadline, start_timeout)
    if got is None:
        os.close(users)  # drops our shared lock: nobody to keep alive
        return None
    if _users_fd is not None:
        os.close(_users_fd)  # a lease on another socket before: this one replaces it
    _users_fd = users
    pid, http = got
    return AgentLease(str(path), pid > 0, pid if pid > 0 else None, http)


def _found_http(path: Path) -> str | None:
    """The HTTP address of an agent that answers already, as its starter recorded it."""
    found = agent_http.recorded(path)
    if found is None:
        log.info("evagg: using the agent on %s; its HTTP address is not known here, so "
                 "%s is left as it is", path, agent_http.ENV_OTLP)
        return None
    address, _ = found
    if address and agent_http.agent_ready(address):
        return address
    _warn_no_http(path, "runs without HTTP" if not address else f"does not answer on {address}")
    return ""


def _warn_no_http(path: Path, what: str) -> None:
    log.warning("evagg: the agent on %s %s: OTLP spans, Ray's events and /metrics cannot "
                "reach it, and %s is not set for this process's workers. To give it HTTP, "
                "stop it and set %s to a free host:port (log: %s)", path, what,
                agent_http.ENV_OTLP, agent_http.ENV_LISTEN, agent_log_path(path))


def _start_if_absent(path: Path, deadline: float,
                     start_timeout: float) -> tuple[int, str | None] | None:
    """(0 when an agent answers already, else the new agent's pid; its HTTP address), or
    None if none could start."""
    starter = _open_lock(start_lock_path(path))
    try:
        if not _lock(starter, fcntl.LOCK_EX, deadline):
            log.warning("evagg: gave up waiting for another process starting an agent on %s",
                        path)
            return None
        if agent_answers(path):
            return 0, _found_http(path)
        return _spawn_agent(path, start_timeout)
    finally:
        os.close(starter)  # releases the start lock


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _lock(fd: int, mode: int, deadline: float) -> bool:
    """flock with a deadline (flock itself has none)."""
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


def _spawn_agent(path: Path, start_timeout: float) -> tuple[int, str | None] | None:
    """Start `python -m aggregator run` on the socket; its pid and HTTP address once it
    answers on both."""
    for listen, address in agent_http.attempts():  # a port may be taken: the next one
        proc = _popen(path, [] if listen is None else ["--http-listen", listen])
        deadline = time.monotonic() + start_timeout
        http = agent_http.client_address(address) if address else None
        if _wait_answering(proc, path, start_timeout) and (
                http is None or agent_http.wait_ready(proc, http, deadline)):
            log.info("evagg: started an agent (pid %d) on %s, HTTP %s; log %s", proc.pid,
                     path, http or "off", agent_log_path(path))
            agent_http.record(path, http or "", proc.pid)
            if http is None:
                _warn_no_http(path, "runs without HTTP (no port could be had)" if listen == ""
                              else "runs without HTTP (its configuration turns it off)")
            return proc.pid, http or ""
        if proc.poll() is None:
            proc.kill()  # ours, and not answering in time: do not leave it half started
            proc.wait()
            break
    log.warning("evagg: the agent did not start on %s; see %s", path, agent_log_path(path))
    return None


def _popen(path: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "aggregator", "run", "--socket", str(path),
               "--exit-when-unused", str(users_lock_path(path)), *extra]
    env = dict(os.environ)
    env.pop(ENV_START, None)  # the agent must not try to start an agent for itself
    home = Path(__file__).resolve().parents[1]  # where `emitters` and `aggregator` live
    if (home / "aggregator" / "__main__.py").exists():
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(home), env.get("PYTHONPATH", "")) if p)
    with agent_log_path(path).open("ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, close_fds=True,
                                start_new_session=True)


def _wait_answering(proc: subprocess.Popen[bytes], path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent_answers(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(POLL_S)
    return False


# -- the agent's side ----------------------------------------------------------------------

def claim_if_unused(users_path: str | os.PathLike[str]) -> int | None:
    """An fd holding the exclusive lock when no user holds a shared one, else None.

    The caller keeps the fd open until it exits, so nobody joins an agent that is leaving.
    """
    fd = _open_lock(Path(users_path))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _reset_after_fork() -> None:
    """A forked child shares the parent's shared lock (same open file): nothing to redo."""
    global _guard
    _guard = threading.Lock()


with contextlib.suppress(AttributeError):
    os.register_at_fork(after_in_child=_reset_after_fork)
