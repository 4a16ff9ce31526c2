"""A minimal wire peer for producer-side benchmarks: acks every frame, stores nothing.

Benchmarks of the emitter's cost use it so the agent's own work is not in the figures.
Run as `python bench/ackpeer.py SOCKET`; it prints "ready" once listening.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def serve(path: str) -> None:
    from emitters import wire

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        frames = wire.FrameBuffer()
        while data := conn.recv(1 << 20):
            frames.feed(data)
            conn.sendall(b"".join(wire.encode_ack(f.session, f.seq, f.count, 0)
                                  for f in frames.frames()
                                  if isinstance(f, (wire.Batch, wire.Columns))))
        conn.close()


def start_ack_peer(path: Path) -> subprocess.Popen[str]:
    """The peer in a subprocess, listening on `path` once this returns."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peer = subprocess.Popen([sys.executable, __file__, str(path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert peer.stdout is not None and peer.stdout.readline().strip() == "ready"
    return peer


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    serve(sys.argv[1])
