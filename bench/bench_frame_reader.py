"""The agent's socket reader alone: event-loop CPU per frame cut from a Unix socket.

    python bench/bench_frame_reader.py [--frames 3000] [--frame-bytes 233000] [--rounds 3]
    python bench/bench_frame_reader.py --compare REV

A thread writes the same frame over and over into one end of a Unix socket pair; the
event loop reads the other end with `aggregator.ingest.frame_reader.FrameReader` and
takes each frame as the socket handler does. Printed: the loop thread's CPU per frame
and per event (a pipeline-bench COLUMNS frame is 1,000 events in about 233 kB), which is
what the reader costs the agent's loop before any decode or spool work.

--compare REV: the reader as committed at git revision REV, loaded beside the working
tree's, in alternating order each round so the load of the moment hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
READER = "aggregator/ingest/frame_reader.py"
EVENTS_PER_FRAME = 1000


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def reader_at(rev: str, folder: Path) -> ModuleType:
    text = subprocess.run(["git", "show", f"{rev}:{READER}"], cwd=REPO, check=True,
                          capture_output=True).stdout
    path = folder / "frame_reader_at_rev.py"
    path.write_bytes(text)
    return load(path, "frame_reader_at_rev")


async def loop_cpu_per_frame(reader_module: ModuleType, frame: bytes, frames: int) -> float:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader = reader_module.FrameReader(max_frame_bytes=len(frame) * 2, frame_timeout_s=60)
    await asyncio.get_running_loop().create_connection(lambda: reader, sock=ours)

    def send() -> None:
        for _ in range(frames):
            theirs.sendall(frame)
        theirs.close()

    sender = threading.Thread(target=send)
    started = time.thread_time()
    sender.start()
    taken = 0
    while True:
        item = await reader.frames.get()
        reader.frame_taken()
        if not isinstance(item, bytes):
            break
        taken += 1
    spent = time.thread_time() - started
    sender.join()
    reader.transport.close()
    assert taken == frames, f"{taken} of {frames} frames came out"
    return spent / frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--frame-bytes", type=int, default=233_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", metavar="REV",
                        help="the reader at git revision REV against this one, side by side")
    args = parser.parse_args()
    frame = args.frame_bytes.to_bytes(4, "big") + os.urandom(args.frame_bytes)
    with tempfile.TemporaryDirectory() as folder:
        readers = {"this tree": load(REPO / READER, "frame_reader_here")}
        if args.compare:
            readers = {args.compare: reader_at(args.compare, Path(folder)), **readers}
        seconds: dict[str, list[float]] = {name: [] for name in readers}
        for round_ in range(args.rounds):
            order = list(readers.items())[:: 1 if round_ % 2 == 0 else -1]
            for name, module in order:
                seconds[name].append(asyncio.run(loop_cpu_per_frame(module, frame, args.frames)))
    print(f"{args.frames} frames of {args.frame_bytes:,} bytes per run, {args.rounds} rounds")
    for name, runs in seconds.items():
        median = statistics.median(runs)
        print(f"{name:>12}: loop CPU {median * 1e6:7.1f} us per frame "
              f"({min(runs) * 1e6:.1f}-{max(runs) * 1e6:.1f}), "
              f"{median / EVENTS_PER_FRAME * 1e9:6.1f} ns per event at {EVENTS_PER_FRAME} a frame")
    if args.compare:
        ratio = statistics.median(seconds["this tree"]) / statistics.median(seconds[args.compare])
        print(f"this tree / {args.compare}: {ratio:.2f}")


if __name__ == "__main__":
    main()
