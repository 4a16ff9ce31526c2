"""Garbage on the socket and the HTTP port: a clear answer, that connection closed, the
counters raised, other producers served, nothing good lost."""

from __future__ import annotations

import os
import struct
import urllib.error
import urllib.request

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emitters import wire
from tests.agentproc import AgentProcess
from tests.aggregator.ingest.socket_client import assert_nack_then_closed, connect, read_answer
from tests.producers import assert_exactly_once, producer_report, start_producer


def batch(payload: bytes, seq: int = 1) -> bytes:
    return wire.encode_batch(os.urandom(16), seq, payload.count(b"\n") + 1, payload)


BAD_FRAMES = {
    "random bytes": (b"\x00\x00\x00\x10" + os.urandom(16), "version"),
    "oversized length": (struct.pack(">I", 2**31) + b"xx", "exceeds the limit"),
    "unknown frame type": (struct.pack(">IBB", 2, 1, 9), "unknown frame type"),
    "ack from a producer": (wire.encode_ack(bytes(16), 1, 1, 0), "only send batch"),
    "short batch header": (struct.pack(">IBB", 5, 1, 1) + b"abc", "shorter than its header"),
    "invalid JSON": (batch(b"{not json"), "invalid JSON"),
    "wrong field types": (batch(b'{"kind": "op", "name": 5}'), "'name' must be a string"),
    "missing kind": (batch(b'{"name": "x"}'), "'kind' is required"),
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frame_gets_nack_and_close(agent: AgentProcess, case: str) -> None:
    raw, reason = BAD_FRAMES[case]
    with connect(agent) as sock:
        sock.sendall(raw)
        assert_nack_then_closed(sock, reason)
    assert agent.metric("evagg_bad_input_total") >= 1
    with connect(agent) as sock:  # the agent still serves
        sock.sendall(batch(b'{"kind": "op", "name": "after"}'))
        answer = read_answer(sock)
        assert isinstance(answer, wire.Ack) and answer.accepted == 1


def test_truncated_frame_then_disconnect_stores_nothing(agent: AgentProcess) -> None:
    whole = batch(b'{"kind": "op", "name": "truncated"}')
    with connect(agent) as sock:
        sock.sendall(whole[: len(whole) // 2])
    assert producer_report(start_producer(agent.socket_path, "ok", 100))["flushed"]
    agent.stop()
    assert agent.query("SELECT count(*) FROM events WHERE name = 'truncated'") == [(0,)]


def test_stalled_client_is_cut_off_while_others_are_served(
        agent_factory: type[AgentProcess]) -> None:
    agent = agent_factory(agent_toml='frame_timeout = "1s"').start()
    stalled = connect(agent)
    whole = batch(b'{"kind": "op", "name": "stalled"}')
    stalled.sendall(whole[:10])
    good = start_producer(agent.socket_path, "good", 1000)
    assert producer_report(good)["flushed"]
    assert_nack_then_closed(stalled, "incomplete")
    stalled.close()
    assert agent.metric('evagg_bad_input_total{reason="stalled"') == 1
    agent.stop()
    assert_exactly_once(agent.lake_dir, {"good": 1000})


def test_partly_bad_frame_keeps_good_events_and_says_why(agent: AgentProcess) -> None:
    payload = b'{"kind": "op", "name": "good1"}\n{"kind": "op", "step": "x"}\n' \
              b'{"kind": "op", "name": "good2", "pid": 1, "uid": 0}'
    with connect(agent) as sock:
        sock.sendall(batch(payload))
        answer = read_answer(sock)
    assert isinstance(answer, wire.Ack)
    assert (answer.accepted, answer.rejected) == (2, 1)
    assert "'step' must be an integer" in answer.note
    agent.stop()
    rows = agent.query("SELECT name, pid, uid FROM events WHERE name LIKE 'good%' ORDER BY name")
    # pid/uid come from the kernel, never from the payload
    assert rows == [("good1", os.getpid(), os.getuid()), ("good2", os.getpid(), os.getuid())]


def test_refused_events_are_said_in_the_agent_log_once_a_minute(agent: AgentProcess) -> None:
    # An operator who sees `rejected` in `evagg status` finds what and from whom in the
    # log; a producer that keeps sending bad events costs one line a minute, not one each.
    payload = b'{"kind": "op", "name": "good"}\n{"kind": "op", "step": "x"}'
    for _ in range(3):
        with connect(agent) as sock:
            sock.sendall(batch(payload))
            answer = read_answer(sock)
        assert isinstance(answer, wire.Ack) and answer.rejected == 1
    status, body = post(agent, "/v1/events", b'{"kind": "task", "duration_s": "slow"}')
    assert status == 400 and body["rejected"] == 1
    agent.stop()
    said = [line for line in agent.log().splitlines() if "refused" in line and "bad event" in line]
    assert len(said) == 2, said  # one for the socket's three, one for HTTP
    socket_line = next(line for line in said if " on socket " in line)
    assert f"refused 1 bad event on socket from pid {os.getpid()}: event 1: field 'step' " \
           "must be an integer" in socket_line
    assert "counts them as rejected" in socket_line
    assert any("on http: event 0: field 'duration_s' must be a number" in line for line in said)


def test_resent_frame_is_stored_once(agent: AgentProcess) -> None:
    frame = wire.encode_batch(b"S" * 16, 7, 1, b'{"kind": "op", "name": "once"}')
    for _ in range(3):
        with connect(agent) as sock:
            sock.sendall(frame)
            answer = read_answer(sock)
            assert isinstance(answer, wire.Ack) and answer.seq == 7
    agent.stop()
    assert agent.query("SELECT count(*) FROM events WHERE name = 'once'") == [(1,)]


def post(agent: AgentProcess, path: str, body: bytes,
         content_type: str = "application/x-ndjson") -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"{agent.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def test_http_events_route_keeps_good_lines_and_rejects_bad(agent: AgentProcess) -> None:
    status, body = post(agent, "/v1/events",
                        b'{"kind": "task", "name": "h1", "extra": {"a": 1}}\n{broken\n'
                        b'{"kind": "task", "name": "h2", "time": "2026-01-02T03:04:05.123456789Z"}')
    assert status == 200 and body["accepted"] == 2 and body["rejected"] == 1
    assert "invalid JSON" in str(body["errors"])
    status, body = post(agent, "/v1/events", b'[{"kind": "task", "name": "h3"}]',
                        "application/json")
    assert status == 200 and body["accepted"] == 1
    status, body = post(agent, "/v1/events", b"\x00\x01garbage")
    assert status == 400 and body["accepted"] == 0
    status, body = post(agent, "/v1/events", b"")
    assert status == 400 and "empty" in str(body["error"])
    agent.stop()
    rows = agent.query("SELECT name FROM events WHERE kind = 'task'")
    assert sorted(rows) == [("h1",), ("h2",), ("h3",)]
    # the file holds microseconds (every engine reads them), the nanoseconds floored
    table = pq.read_table(agent.lake_dir, filters=[("name", "=", "h2")], columns=["time"])
    assert table["time"].type == pa.timestamp("us", tz="UTC")
    assert table["time"].cast(pa.int64()).to_pylist() == [1767323045123456]
    attrs = agent.query("SELECT attrs['extra'] FROM events WHERE name = 'h1'")
    assert attrs == [('{"a":1}',)]


def test_http_body_over_the_limit_is_refused(agent_factory: type[AgentProcess]) -> None:
    agent = agent_factory(agent_toml='http_max_body = "1KiB"').start()
    status, body = post(agent, "/v1/events", b'{"kind": "op"}\n' * 200)
    assert status == 413 and "larger than" in str(body["error"])
    assert agent.metric('evagg_bad_input_total{reason="too_large"') == 1


def test_a_refusal_quoting_producer_text_logs_only_its_start(agent: AgentProcess) -> None:
    name = "m" * 300_000
    line = orjson.dumps({"kind": "op", "metrics": {name: "not a number"}})
    with connect(agent) as sock:
        sock.sendall(batch(line))
        answer = read_answer(sock)
        assert isinstance(answer, wire.Nack) and len(answer.reason) <= 4096
    agent.stop()
    logged = [text for text in agent.log().splitlines() if "closing producer" in text]
    assert logged and all(len(text) < 1000 for text in logged)


def test_an_encoding_the_agent_cannot_read_is_415_and_stores_nothing(agent: AgentProcess) -> None:
    request = urllib.request.Request(f"{agent.http_url}/v1/events", method="POST",
                                     data=b'{"kind": "op", "name": "packed"}\n',
                                     headers={"Content-Type": "application/x-ndjson",
                                              "Content-Encoding": "snappy"})
    try:
        urllib.request.urlopen(request, timeout=20)
        raise AssertionError("accepted a body it cannot read")
    except urllib.error.HTTPError as error:
        assert error.code == 415 and "snappy" in orjson.loads(error.read())["error"]
    agent.stop()
    assert agent.query("SELECT count(*) FROM events WHERE name = 'packed'") == [(0,)]


def test_ndjson_whose_first_line_is_a_list_keeps_the_good_lines(agent: AgentProcess) -> None:
    status, body = post(agent, "/v1/events", b'[1, 2]\n{"kind": "op", "name": "kept"}\n')
    assert status == 200 and (body["accepted"], body["rejected"]) == (1, 1)
    status, body = post(agent, "/v1/events", b'[{"kind": "op", "name": "array"}]')
    assert status == 200 and body["accepted"] == 1  # one JSON array is still one batch
    status, body = post(agent, "/v1/events", b'[{"kind": "op"')
    assert status == 400 and "invalid JSON array" in str(body["errors"])
