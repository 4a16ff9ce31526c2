"""Is this the process we saw? /proc/<pid>/stat read for tracked pids only.

A pid alone names a process only while it lives: after it exits the kernel hands the
number out again. So a process is known by (pid, start time in clock ticks since boot),
read when it is first seen, and by the boot it was seen in; it is gone once /proc/<pid>
is missing, shows another start time, is a zombie (it exited and waits to be reaped),
or the machine booted since.
"""

from __future__ import annotations

import os
import subprocess
from typing import NamedTuple

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class Identity(NamedTuple):
    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat


def boot_id() -> str:
    """This boot's id; "" where /proc does not say (then no earlier boot is ruled out)."""
    try:
        with open(_BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def identity_of(pid: int) -> Identity | None:
    """The live process at `pid` now, or None when there is none (or only a zombie)."""
    stat = _stat_fields(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return None
    return Identity(pid, int(stat[19]))


def is_running(pid: int) -> bool:
    """Whether a process runs at `pid` (a zombie has exited)."""
    return identity_of(pid) is not None


def is_alive(identity: Identity) -> bool:
    return identity_of(identity.pid) == identity


def gone_of(identities: list[Identity]) -> list[Identity]:
    """Those of `identities` that are no longer alive (one stat read each)."""
    return [identity for identity in identities if not is_alive(identity)]


def started_ns(identity: Identity) -> int:
    """When the process started, in ns since the epoch (for "was it there at that event")."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return _boot_time_ns() + identity.start_ticks * 1_000_000_000 // ticks_per_s


def command_line(pid: int) -> str:
    """The process's argv as one line, quoted as Ray quotes a driver's entrypoint."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return ""
    if raw.endswith(b"\0"):  # as psutil reads it, which Ray uses for the entrypoint
        raw = raw[:-1]
    return subprocess.list2cmdline([a.decode(errors="replace") for a in raw.split(b"\0")])


def is_evagg_emit(pid: int) -> bool:
    """Whether `pid` runs `evagg emit` (or `python -m aggregator emit`): a messenger that
    exits as soon as its events are acked, so its exit says nothing of the task."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(arg) in (b"evagg", b"aggregator") and argv[i + 1:i + 2] == [b"emit"]
               for i, arg in enumerate(argv))


def _stat_fields(pid: int) -> list[str] | None:
    """The fields after the command name (which may hold spaces and parentheses)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


_BOOT_NS: list[int] = []


def _boot_time_ns() -> int:
    if not _BOOT_NS:
        boot = 0
        try:
            with open("/proc/stat", encoding="ascii") as handle:
                boot = next((int(line.split()[1]) for line in handle
                             if line.startswith("btime ")), 0)
        except OSError:
            pass
        _BOOT_NS.append(boot * 1_000_000_000)
    return _BOOT_NS[0]
