"""What a node's many quiet producers cost the agent: its RSS with N producer connections
open, first idle (connected, nothing sent), then each after one small frame (a quiet
training loop's or Ray worker's first events), as a node's Ray workers, dataloader
workers and ranks hold them. Up to `agent.max_connections` (1,024 by default) may be
open at once, so the figure per connection times that is what the cap lets a node's
producers, or a hostile local client, take.

    .venv/bin/python bench/bench_connections.py [--connections 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emitters import wire  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402

_ACK_HEADER = struct.Struct(">I")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def settled_rss(pid: int, seconds: float = 2.0) -> float:
    time.sleep(seconds)  # the agent's loop takes the connections and frames meanwhile
    return rss_mib(pid)


def small_frame(seq: int) -> bytes:
    """One NDJSON frame of three events, about 300 bytes: a quiet producer's flush."""
    events = [{"kind": "op", "name": "forward", "state": "FINISHED", "duration_s": 0.01,
               "step": seq * 3 + i} for i in range(3)]
    payload = b"".join(orjson.dumps(event) + b"\n" for event in events)
    return wire.encode_batch(os.urandom(16), seq, len(events), payload)


def read_ack(sock: socket.socket) -> None:
    header = sock.recv(_ACK_HEADER.size, socket.MSG_WAITALL)
    (length,) = _ACK_HEADER.unpack(header)
    sock.recv(length, socket.MSG_WAITALL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.connections + 100)),
                                                hard))
    with tempfile.TemporaryDirectory(prefix="evagg-bench-") as workdir:
        agent = AgentProcess(Path(workdir), agent_toml=(
            f"max_connections = {args.connections + 10}")).start()
        assert agent.proc is not None
        pid = agent.proc.pid
        socks: list[socket.socket] = []
        try:
            base = settled_rss(pid)
            for _ in range(args.connections):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(agent.socket_path))
                socks.append(sock)
            idle = settled_rss(pid)
            for sock in socks:
                sock.sendall(small_frame(1))
            for sock in socks:
                read_ack(sock)
            after_frame = settled_rss(pid)
            n = args.connections
            print(f"agent RSS {base:.0f} MiB with no producer connection")
            print(f"  {n} idle connections: {idle:.0f} MiB, "
                  f"{(idle - base) * 1024 / n:.1f} KiB per connection")
            print(f"  each after one small frame: {after_frame:.0f} MiB, "
                  f"+{after_frame - idle:.0f} MiB for the {n} frames: their batches, spool "
                  "records and Parquet rows, which the allocator keeps for the next")
        finally:
            for sock in socks:
                sock.close()
            agent.stop()


if __name__ == "__main__":
    main()
