"""Hostile clients of a real agent's HTTP port, which every local user (and every
container on the host's network) reaches: a request whose headers never end, a body
that stops half way, and connections opened by the hundred and held. Each costs the
agent a file descriptor for as long as the client likes; the socket, the spool and the
sinks need theirs. A stalled request is cut off after frame_timeout, as a stalled frame
on the socket is, and connections beyond max_connections are closed at once, so a
producer on the socket is still answered."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from emitters import wire
from tests.agentproc import AgentProcess
from tests.aggregator.ingest.socket_client import connect, read_answer
from tests.limits import (
    descriptor_limits,
    held_connections,
    runs_with_fewer_descriptors,
    with_fewer_descriptors,
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    started = AgentProcess(tmp_path_factory.mktemp("hostile"),
                           agent_toml='frame_timeout = "1s"\nmax_connections = 50')
    started.prefix = with_fewer_descriptors()  # a node's, scaled down
    with started:
        assert started.proc is not None
        assert runs_with_fewer_descriptors(started.proc.pid), descriptor_limits(started.proc.pid)
        yield started


def tcp(agent: AgentProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", agent.port), timeout=10)
    sock.settimeout(10)
    return sock


def closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> bytes | None:
    """What the agent answered before closing, within `seconds`; None if still open.
    `drip` is sent every 0.3 s meanwhile, as a slow client does."""
    deadline = time.monotonic() + seconds
    answer = b""
    sock.settimeout(0.3)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if drip:
                try:
                    sock.sendall(drip)
                except OSError:
                    return answer
            continue
        except ConnectionResetError:
            return answer
        if not chunk:
            return answer
        answer += chunk
    return None


def test_headers_that_never_end_are_cut_off(agent: AgentProcess) -> None:
    sock = tcp(agent)
    sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    assert closed_within(sock, 8, drip=b"X-Slow: 1\r\n") is not None, \
        "a request whose headers never end holds its connection"
    sock.close()


def test_a_body_that_stops_half_way_is_refused_and_not_stored(agent: AgentProcess) -> None:
    body = b'{"kind": "op", "name": "half-a-body", "state": "FINISHED"}\n'
    sock = tcp(agent)
    sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Length: %d\r\n\r\n" % (len(body) + 100) + body)
    answer = closed_within(sock, 8)
    sock.close()
    assert answer is not None, "a body that stops half way holds its connection"
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"stalled" in answer
    assert agent.metric('evagg_bad_input_total{reason="stalled"') >= 1


def test_held_connections_leave_the_socket_answering(agent: AgentProcess) -> None:
    with held_connections(agent.port):  # more than the agent's descriptors
        producer = connect(agent)
        producer.settimeout(5)
        producer.sendall(wire.encode_batch(os.urandom(16), 1, 1,
                                           b'{"kind": "op", "name": "still-served"}'))
        answer = read_answer(producer)
        producer.close()
        assert isinstance(answer, wire.Ack) and answer.accepted == 1, answer
    assert refused_http_connections(agent) > 0


def refused_http_connections(agent: AgentProcess) -> float:
    """Once the held connections are gone: until then a scrape is one too many."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return agent.metric('evagg_bad_input_total{reason="too_many_connections",'
                                'route="http"}')
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
