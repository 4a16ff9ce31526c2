"""Run a command under a seccomp filter that denies the named system calls, as systemd's
`SystemCallFilter=~...` does: `python -m tests.proof.seccomp_run DENIED ERRNO -- argv...`,
DENIED a file of system call names, ERRNO the number a denied call fails with (0: the
process is killed, systemd's default without `SystemCallErrorNumber=`).

libseccomp through ctypes, as systemd itself loads the filter; names this kernel's
architecture does not know are skipped, as systemd skips them.
"""

from __future__ import annotations

import ctypes
import os
import sys

ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
ERRNO = 0x00050000


def load_filter(names: list[str], errno: int) -> int:
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    action = ERRNO | errno if errno else KILL_PROCESS
    context = lib.seccomp_init(ALLOW)
    denied = 0
    for name in names:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number >= 0 and lib.seccomp_rule_add(context, action, number, 0) == 0:
            denied += 1
    if lib.seccomp_load(context) != 0:
        raise OSError("seccomp_load failed")
    return denied


def main(argv: list[str]) -> None:
    denied_file, errno, separator, *command = argv
    assert separator == "--" and command, __doc__
    with open(denied_file, encoding="utf-8") as handle:
        load_filter(handle.read().split(), int(errno))
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
