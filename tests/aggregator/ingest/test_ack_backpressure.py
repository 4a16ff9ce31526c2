"""Producers that could make the agent hold memory without bound, through a real agent:
one that never reads its acks (the agent stops reading from it once the unread acks
fill its write buffer, and serves it again when it reads them), and more connections
than `max_connections` (the extra ones are closed, their producers keep their events
and come back; the others are served)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from emitters import Emitter, wire
from tests.agentproc import AgentProcess
from tests.aggregator.ingest.socket_client import read_answer
from tests.waiting import wait_until

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
            # paused for its unread acks, not merely slow: the agent counts that pause
            wait_until(lambda: agent.metric("evagg_unread_ack_pauses_total") >= 1, 30,
                       "the agent pausing the producer that reads no acks")
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


def test_connections_over_the_cap_are_refused_and_the_rest_served(tmp_path: Path) -> None:
    """max_connections bounds what many producers can hold (frames, file descriptors)."""
    with AgentProcess(tmp_path, agent_toml="max_connections = 2") as agent:
        held = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        for sock in held:
            sock.settimeout(20)
            sock.connect(str(agent.socket_path))
        served = 'evagg_open_connections '
        wait_until(lambda: agent.metric(served) == 2, 20, "both connections to be served")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as third:
            third.settimeout(20)
            third.connect(str(agent.socket_path))
            assert read_answer(third) is None  # closed at once, no NACK: come back later
        held[0].sendall(FRAME)
        assert isinstance(read_answer(held[0]), wire.Ack)  # the others are served
        held.pop().close()
        wait_until(lambda: agent.metric(served) == 1, 20, "the agent to see one close")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as again:  # room again
            again.settimeout(20)
            again.connect(str(agent.socket_path))
            again.sendall(wire.encode_batch(b"C" * 16, 1, 1, b'{"kind": "op", "name": "c"}'))
            assert isinstance(read_answer(again), wire.Ack)
        held[0].close()
        assert agent.metric('evagg_bad_input_total{reason="too_many_connections"') == 1


def test_an_emitter_refused_for_the_cap_keeps_its_events_and_delivers_later(
        tmp_path: Path) -> None:
    with AgentProcess(tmp_path, agent_toml="max_connections = 1") as agent:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hold:
            hold.connect(str(agent.socket_path))
            wait_until(lambda: agent.metric("evagg_open_connections ") == 1, 20,
                       "the agent to serve the one connection it allows")
            emitter = Emitter(socket=agent.socket_path)
            for step in range(10):
                emitter.emit(kind="op", name="later", step=step)
            assert not emitter.flush(1.0)  # refused meanwhile: still queued
        assert emitter.flush(20.0)
        emitter.close(1.0)
        assert emitter.stats().dropped == {}
    assert agent.query("SELECT count(*) FROM events WHERE name = 'later'") == [(10,)]

