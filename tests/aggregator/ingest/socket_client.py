"""A raw producer connection to a real agent's socket: what tests that speak the wire
protocol by hand read back (an ack, a nack, the agent closing)."""

from __future__ import annotations

import socket

from emitters import wire
from tests.agentproc import AgentProcess


def connect(agent: AgentProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(str(agent.socket_path))
    return sock


def read_answer(sock: socket.socket) -> wire.Frame | None:
    """The agent's next frame, or None once it closed the connection."""
    buffer = wire.FrameBuffer()
    while True:
        frame = buffer.pop()
        if frame is not None:
            return frame
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer.feed(chunk)


def assert_nack_then_closed(sock: socket.socket, reason_part: str) -> None:
    answer = read_answer(sock)
    assert isinstance(answer, wire.Nack), answer
    assert reason_part in answer.reason
    assert read_answer(sock) is None  # closed by the agent
