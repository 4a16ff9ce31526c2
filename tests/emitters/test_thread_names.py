"""evagg's threads carry their names at the operating system (`top -H`, py-spy): a
producer's emitter sender among its training process's threads, and a name cut as Linux
cuts it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from emitters import Emitter
from emitters.thread_names import name_this_thread
from tests.threads import thread_names
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="thread names are read from Linux's /proc")


def test_a_producer_s_sender_thread_is_named_in_its_process(tmp_path: Path) -> None:
    emitter = Emitter(socket=tmp_path / "none.sock")  # no agent: the sender runs anyway
    try:
        emitter.emit(kind="task", name="x")
        me = int(Path("/proc/self").resolve().name)
        wait_for(lambda: "evagg-emitter" in thread_names(me) or None, 10,
                 "the sender thread under its name", interval=0.05)
    finally:
        emitter.close(0.1)


def test_a_name_is_cut_to_what_linux_keeps_and_never_raises() -> None:
    seen: list[str] = []

    def run() -> None:
        name_this_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=run, name="evagg-a-very-long-thread-name")
    thread.start()
    thread.join()
    assert seen == ["evagg-a-very-lo\n"]
