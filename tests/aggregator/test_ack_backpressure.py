"""A producer that never reads its acks (a stuck or hostile client): the agent stops
reading from it once the unread acks fill its write buffer, so its memory stays bounded,
and serves it again as soon as it reads them, through a real agent."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from emitters import wire
from tests.agentproc import AgentProcess
from tests.aggregator.test_bad_input import read_answer

FRAME = wire.encode_batch(b"A" * 16, 1, 1, b'{"kind": "op", "name": "acked"}')
LIMIT = 8 * 2**20  # without backpressure the agent reads all of this, and more


def send_until_blocked(sock: socket.socket, quiet_s: float = 1.0) -> int:
    """Bytes sent (the same frame over and over) until the agent stops reading."""
    sock.setblocking(False)
    chunk, sent, blocked_since = FRAME * 512, 0, None
    while sent < LIMIT:
        try:
            sent += sock.send(chunk)
            blocked_since = None
        except BlockingIOError:
            blocked_since = blocked_since or time.monotonic()
            if time.monotonic() - blocked_since >= quiet_s:
                break
            time.sleep(0.01)
    return sent


def test_a_producer_that_reads_no_acks_is_paused_then_served_again(tmp_path: Path) -> None:
    with AgentProcess(tmp_path) as agent:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(agent.socket_path))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sent = send_until_blocked(sock)
            assert sent < LIMIT, "the agent kept reading although no ack was read"
            frames = sent // len(FRAME)
            sock.setblocking(True)
            sock.settimeout(20)
            buffer, acks = wire.FrameBuffer(), 0
            while acks < frames:  # reading the acks lets the agent take the rest
                buffer.feed(sock.recv(65536))
                while (answer := buffer.pop()) is not None:
                    assert isinstance(answer, wire.Ack)
                    acks += 1
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with other:  # and the agent still serves everyone
            other.settimeout(20)
            other.connect(str(agent.socket_path))
            other.sendall(wire.encode_batch(b"B" * 16, 1, 1, b'{"kind": "op", "name": "b"}'))
            assert isinstance(read_answer(other), wire.Ack)
