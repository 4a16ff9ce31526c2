"""evagg's threads under their Python names for the operating system.

Python 3.11 leaves every thread the process's name, so `top -H`, `ps -L`, py-spy and
/proc/<pid>/task/*/comm show a row of `python` threads and nobody can tell the agent's
decoding from its Parquet writing, or a training process's evagg sender from its
dataloader. Each of evagg's threads names itself when it starts (`name_this_thread`, a
pool's `initializer`): the agent's, its hour merge's, and the emitter's sender in every
producer. Linux keeps the first 15 bytes. Elsewhere, or without glibc's
pthread_setname_np, threads keep the process's name. Standard library only: the emitters
import it.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable

_NAME_BYTES = 15  # Linux's limit, less the terminating NUL


def name_this_thread() -> None:
    """Give the calling thread its Python name (`threading.current_thread().name`) at the
    operating system. Never raises: a name is for people reading `top`."""
    setname = _setname()
    if setname is None:
        return
    name = threading.current_thread().name.encode("utf-8", "replace")[:_NAME_BYTES]
    try:
        setname(threading.get_ident(), name)
    except (OSError, ctypes.ArgumentError):
        return


@functools.cache
def _setname() -> Callable[[int, bytes], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:  # the process's own symbols, libc's among them: no search for the library
        setname = ctypes.CDLL(None).pthread_setname_np
    except (OSError, AttributeError):  # not glibc
        return None
    setname.argtypes = [ctypes.c_ulong, ctypes.c_char_p]
    setname.restype = ctypes.c_int
    found: Callable[[int, bytes], int] = setname
    return found
