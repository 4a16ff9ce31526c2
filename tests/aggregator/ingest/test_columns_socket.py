"""COLUMNS frames at the real agent's socket: a good one is stored, a hostile one gets a
NACK that names the column and the reason, its connection is closed, and the agent goes
on serving everyone else."""

from __future__ import annotations

import os
import struct

from emitters import wire
from tests.agentproc import AgentProcess
from tests.aggregator.ingest.socket_client import assert_nack_then_closed, connect, read_answer
from tests.producers import assert_exactly_once, producer_report, start_producer


def entry(name: str, kind: str, lengths: list[int]) -> bytes:
    return (bytes([len(name)]) + name.encode() + bytes([len(kind)]) + kind.encode()
            + struct.pack(">IB", 1, len(lengths)) + b"".join(struct.pack(">I", n)
                                                             for n in lengths))


def columns_frame(kind: bytes, seq: int = 1) -> bytes:
    """One event: a time and a kind, laid out by hand as docs/wire-protocol.md says."""
    table = [entry("time", "timestamp_ns", [0, 8]), entry("kind", "string", [0, 8, len(kind)])]
    head = struct.pack(">H", len(table)) + b"".join(table)
    body = head + bytes(-(30 + len(head)) % 8)
    for part in (b"", struct.pack("<q", 1_700_000_000 * 10**9), b"",
                 struct.pack("<ii", 0, len(kind)), kind):
        body += part + bytes(-len(part) % 8)
    return wire.encode_columns(os.urandom(16), seq, 1, body)


def test_a_handmade_columns_frame_is_stored(agent: AgentProcess) -> None:
    with connect(agent) as sock:
        sock.sendall(columns_frame(b"handmade"))
        answer = read_answer(sock)
    assert isinstance(answer, wire.Ack) and answer.accepted == 1
    agent.stop()
    rows = agent.query("SELECT pid, uid FROM events WHERE kind = 'handmade'")
    assert rows == [(os.getpid(), os.getuid())]


def test_a_hostile_columns_frame_is_refused_and_others_are_served(agent: AgentProcess) -> None:
    good = start_producer(agent.socket_path, "good", 2000)
    with connect(agent) as sock:
        sock.sendall(columns_frame(b"t\xffsk"))
        assert_nack_then_closed(sock, "column 'kind'")
    with connect(agent) as sock:
        body = columns_frame(b"xxx")[4:-8]  # its last buffer cut off
        sock.sendall(struct.pack(">I", len(body)) + body)
        assert_nack_then_closed(sock, "column 'kind': its data buffer runs past the frame")
    assert producer_report(good)["flushed"]
    assert agent.metric('evagg_bad_input_total{reason="columns_refused"') == 2
    agent.stop()
    assert_exactly_once(agent.lake_dir, {"good": 2000})
