"""Fuzzing every way in: the frame decoder in process, then the Unix socket and the three
HTTP ingest routes of one real running agent, under hypothesis (bounded examples).

Properties: the decoder only ever returns a frame or raises FrameError; the agent answers
every input with an ack, a nack or a 4xx (never a 5xx, never a hang), /healthz stays 200,
no background worker ever catches an exception, and a well-behaved producer running
alongside the whole module loses nothing and duplicates nothing.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import socket
import struct
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from emitters import wire
from emitters.fields import EVENT_FIELDS, KINDS
from tests.agentproc import AgentProcess, query_lake
from tests.producers import producer_report, start_producer
from tests.proof import http_status, metric_where

REPO = Path(__file__).resolve().parents[2]
GOOD_EVENTS = 20_000
# No shrinking against the live agent: a failure reports its first example, in bounded time.
FUZZ = settings(max_examples=120, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
             | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=5)
                          | st.dictionaries(st.text(max_size=12), inner, max_size=5),
                          max_leaves=12)
event_dict = st.fixed_dictionaries(
    {"kind": st.sampled_from(KINDS) | json_value},
    optional={name: json_value for name in EVENT_FIELDS if name != "kind"} | {"extra": json_value})


def dumps(value: Any) -> bytes:
    """JSON as a sloppy producer writes it: NaN and Infinity included."""
    return json.dumps(value, allow_nan=True).encode()


class Fuzzed:
    def __init__(self, agent: AgentProcess, good: subprocess.Popen[bytes]) -> None:
        self.agent = agent
        self.good = good


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    """One agent for the module, and a well-behaved producer emitting all along."""
    agent = AgentProcess(tmp_path_factory.mktemp("fuzz"), agent_toml='frame_timeout = "1s"')
    agent.start()
    good = start_producer(agent.socket_path, "good", GOOD_EVENTS, seconds=15, flush_timeout=60)
    yield Fuzzed(agent, good)
    good.kill()
    agent.kill()


def assert_alive(agent: AgentProcess) -> None:
    assert agent.running, agent.log()[-3000:]
    assert http_status(f"{agent.http_url}/healthz") == 200


# -- the frame decoder, in process ---------------------------------------------------------

@settings(max_examples=600, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_decode_body_returns_a_frame_or_raises_frame_error(body: bytes) -> None:
    try:
        frame = wire.decode_body(body)
    except wire.FrameError as exc:
        assert str(exc)  # the reason a NACK carries
        return
    assert isinstance(frame, wire.Batch | wire.Ack | wire.Nack)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.binary(max_size=64), max_size=12), st.integers(1, 256))
def test_frame_buffer_on_arbitrary_chunks_yields_frames_or_frame_error(
        chunks: list[bytes], limit: int) -> None:
    buffer = wire.FrameBuffer(max_frame_bytes=limit)
    try:
        for chunk in chunks:
            buffer.feed(chunk)
            for frame in buffer.frames():
                assert isinstance(frame, wire.Batch | wire.Ack | wire.Nack)
    except wire.FrameError:
        return


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(min_size=16, max_size=16), st.integers(0, 2**64 - 1),
       st.integers(0, 2**32 - 1), st.binary(max_size=300), st.data())
def test_batch_round_trips_through_any_split(session: bytes, seq: int, count: int,
                                             payload: bytes, data: st.DataObject) -> None:
    raw = wire.encode_batch(session, seq, count, payload)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=5)))
    buffer = wire.FrameBuffer()
    frames: list[wire.Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        buffer.feed(raw[start:end])
        frames += buffer.frames()
    assert frames == [wire.Batch(session, seq, count, payload)]
    assert buffer.pending_bytes == 0


# -- the Unix socket -----------------------------------------------------------------------

def converse(agent: AgentProcess, raw: bytes) -> list[wire.Frame]:
    """Send `raw`, close our side, read every answer until the agent closes."""
    answers: list[wire.Frame] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(agent.socket_path))
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the agent closed first, after a nack for an early part
        buffer = wire.FrameBuffer()
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buffer.feed(chunk)
            answers += buffer.frames()
    assert buffer.pending_bytes == 0
    return answers


def batch_frame(payload: bytes, data: st.DataObject) -> bytes:
    session = data.draw(st.binary(min_size=16, max_size=16))
    seq = data.draw(st.integers(0, 2**64 - 1))
    count = data.draw(st.integers(0, 2**32 - 1))
    return wire.encode_batch(session, seq, count, payload)


socket_input = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n, body: struct.pack(">I", n) + body,
              st.integers(0, 2**32 - 1), st.binary(max_size=64)),
)


@FUZZ
@given(raw=socket_input)
def test_socket_garbage_is_nacked_or_dropped_never_fatal(fuzzed: Fuzzed, raw: bytes) -> None:
    for answer in converse(fuzzed.agent, raw):
        assert isinstance(answer, wire.Ack | wire.Nack)
    assert_alive(fuzzed.agent)


@FUZZ
@given(events=st.lists(event_dict, min_size=1, max_size=5), data=st.data())
def test_socket_batches_of_hostile_events_get_an_answer(
        fuzzed: Fuzzed, events: list[dict[str, Any]], data: st.DataObject) -> None:
    lines = [dumps(e) for e in events]
    if data.draw(st.booleans()):
        lines.append(data.draw(st.binary(max_size=40)))  # one line that is not JSON at all
    raw = batch_frame(b"\n".join(lines), data)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(fuzzed.agent.socket_path))
        sock.sendall(raw)
        answer = next_answer(sock)
    assert isinstance(answer, wire.Ack | wire.Nack), answer
    assert_alive(fuzzed.agent)


def next_answer(sock: socket.socket) -> wire.Frame | None:
    """The agent's next frame, or None if it closed the connection first."""
    buffer = wire.FrameBuffer()
    while (frame := buffer.pop()) is None:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer.feed(chunk)
    return frame


def test_a_producer_that_half_closes_still_gets_its_ack(fuzzed: Fuzzed) -> None:
    """send(frame); shutdown(SHUT_WR); recv(): the frame is spooled, so it is acked.
    (Whether the end of stream arrives with the frame or after it is up to the scheduler:
    try several times.)"""
    for attempt in range(20):
        payload = b'{"kind": "op", "name": "half-closed"}'
        answers = converse(fuzzed.agent, wire.encode_batch(os.urandom(16), 1, 1, payload))
        assert [type(a) for a in answers] == [wire.Ack], (attempt, answers)


# -- the HTTP routes -----------------------------------------------------------------------

def post(agent: AgentProcess, path: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(f"{agent.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def assert_answered(fuzzed: Fuzzed, path: str, body: bytes, content_type: str) -> None:
    status = post(fuzzed.agent, path, body, content_type)
    assert 200 <= status < 500, (status, body[:200])
    assert_alive(fuzzed.agent)


ndjson_body = st.one_of(
    st.binary(max_size=300),
    st.lists(event_dict, max_size=6).map(lambda es: b"\n".join(dumps(e) for e in es)),
    st.lists(event_dict, max_size=6).map(dumps),  # a JSON array
    json_value.map(dumps),
)


@FUZZ
@given(body=ndjson_body)
def test_http_events_route(fuzzed: Fuzzed, body: bytes) -> None:
    assert_answered(fuzzed, "/v1/events", body, "application/x-ndjson")


def load_ray_samples() -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    for path in sorted((REPO / "tests" / "fixtures" / "ray").glob("*.json")):
        doc = orjson.loads(path.read_bytes())
        samples += doc["events"] if isinstance(doc, dict) else doc
    return samples


RAY_SAMPLES = load_ray_samples()


def mutated(value: Any, data: st.DataObject, depth: int = 0) -> Any:
    """A real payload with some values replaced, keys dropped or added."""
    roll = data.draw(st.integers(0, 9))
    if roll == 0 or depth > 6:
        return data.draw(json_value) if roll == 0 else value
    if isinstance(value, dict):
        out = {k: mutated(v, data, depth + 1) for k, v in value.items()
               if data.draw(st.integers(0, 15)) != 0}
        if roll == 1:
            out[data.draw(st.text(max_size=12))] = data.draw(json_value)
        return out
    if isinstance(value, list):
        return [mutated(v, data, depth + 1) for v in value]
    return value


@FUZZ
@given(data=st.data())
def test_ray_events_route(fuzzed: Fuzzed, data: st.DataObject) -> None:
    if data.draw(st.integers(0, 4)) == 0:
        body = data.draw(st.binary(max_size=200) | json_value.map(dumps))
    else:
        events = data.draw(st.lists(st.sampled_from(RAY_SAMPLES), min_size=1, max_size=4))
        body = dumps([mutated(e, data) for e in events])
    assert_answered(fuzzed, "/ray/events", body, "application/json")


OTLP_JSON = {"resourceSpans": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
    "scopeSpans": [{"scope": {"name": "lib"}, "spans": [{
        "traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "EEE19B7EC3C1B174",
        "parentSpanId": "EEE19B7EC3C1B173", "name": "span", "kind": 2,
        "startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": "1544712661000000000",
        "attributes": [{"key": "n", "value": {"intValue": "3"}},
                       {"key": "list", "value": {"arrayValue": {"values": [
                           {"doubleValue": 1.5}, {"kvlistValue": {"values": []}}]}}}],
        "events": [{"timeUnixNano": "1544712660500000000", "name": "e"}],
        "status": {"code": 2, "message": "bad"}}]}]}]}


def otlp_protobuf() -> bytes:
    from google.protobuf import json_format  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    message = trace_service_pb2.ExportTraceServiceRequest()
    doc = json.loads(json.dumps(OTLP_JSON))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    for key in ("traceId", "spanId", "parentSpanId"):  # protobuf JSON carries ids as base64
        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    json_format.ParseDict(doc, message)
    return bytes(message.SerializeToString())


@FUZZ
@given(data=st.data())
def test_otlp_traces_route_protobuf(fuzzed: Fuzzed, data: st.DataObject) -> None:
    seed = bytearray(otlp_protobuf())
    if data.draw(st.booleans()):
        body = data.draw(st.binary(max_size=300))
    else:
        for _ in range(data.draw(st.integers(1, 8))):  # flip, cut or insert bytes
            where = data.draw(st.integers(0, len(seed) - 1))
            seed[where] = data.draw(st.integers(0, 255))
        body = bytes(seed[: data.draw(st.integers(1, len(seed)))])
    assert_answered(fuzzed, "/v1/traces", body, "application/x-protobuf")


@FUZZ
@given(data=st.data())
def test_otlp_traces_route_json(fuzzed: Fuzzed, data: st.DataObject) -> None:
    if data.draw(st.integers(0, 4)) == 0:
        body = data.draw(st.binary(max_size=200) | json_value.map(dumps))
    else:
        body = dumps(mutated(OTLP_JSON, data))
    assert_answered(fuzzed, "/v1/traces", body, "application/json")


# -- afterwards: nothing went wrong inside, nothing good was lost ----------------------------

def worker_failures(agent: AgentProcess) -> str:
    counted = [line for line in agent.metrics().splitlines()
               if line.startswith("evagg_worker_errors_total")]
    tracebacks = agent.log().split("Traceback (most recent call last):")[1:]
    return "\n".join(counted) + "\n" + "\n---\n".join(t[-1500:] for t in tracebacks[-3:])


def random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.randrange(8 if depth < 3 else 5)
    leaves = [None, rng.random() < 0.5, rng.randrange(-(2**70), 2**70),
              rng.choice([math.nan, math.inf, -math.inf, rng.uniform(-1e9, 1e9)]),
              "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(12)))]
    if roll < 5:
        return leaves[roll]
    if roll < 7:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(random_json(rng, 3))[:10]: random_json(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def mutated_by(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """`mutated` with a seeded random source in place of hypothesis's draws."""
    roll = rng.randrange(10)
    if roll == 0 or depth > 6:
        return random_json(rng) if roll == 0 else value
    if isinstance(value, dict):
        out = {k: mutated_by(rng, v, depth + 1) for k, v in value.items()
               if rng.randrange(16)}
        if roll == 1:
            out[str(random_json(rng, 3))[:12]] = random_json(rng)
        return out
    if isinstance(value, list):
        return [mutated_by(rng, v, depth + 1) for v in value]
    return value


def fuzz_every_door_once_more(agent: AgentProcess, seed: int) -> None:
    """A seeded round of hostile inputs at every door, so that the test after it proves
    its point whether or not (and in whatever order) the fuzz tests above ran."""
    rng = random.Random(seed)
    for _ in range(30):
        raw = rng.randbytes(rng.randrange(300))
        if rng.random() < 0.3:
            raw = struct.pack(">I", rng.randrange(2**32)) + raw[:64]
        for answer in converse(agent, raw):
            assert isinstance(answer, wire.Ack | wire.Nack)
    for _ in range(20):
        lines = [dumps({"kind": rng.choice([*KINDS, 5, None]), rng.choice(
            sorted(EVENT_FIELDS)): random_json(rng)}) for _ in range(rng.randrange(1, 5))]
        raw = wire.encode_batch(rng.randbytes(16), rng.randrange(2**64), rng.randrange(2**32),
                                b"\n".join([*lines, rng.randbytes(rng.randrange(40))]))
        converse(agent, raw)
    protobuf = otlp_protobuf()
    for _ in range(20):
        events = [dumps({"kind": rng.choice(KINDS), "name": random_json(rng)}),
                  rng.randbytes(rng.randrange(200))]
        post(agent, "/v1/events", b"\n".join(events), "application/x-ndjson")
        ray = [mutated_by(rng, e) for e in rng.sample(RAY_SAMPLES, rng.randrange(1, 4))]
        post(agent, "/ray/events", dumps(ray), "application/json")
        post(agent, "/v1/traces", dumps(mutated_by(rng, OTLP_JSON)), "application/json")
        cut = bytearray(protobuf)
        for _ in range(rng.randrange(1, 8)):
            cut[rng.randrange(len(cut))] = rng.randrange(256)
        post(agent, "/v1/traces", bytes(cut[:rng.randrange(1, len(cut))]),
             "application/x-protobuf")
    assert_alive(agent)


def test_after_fuzzing_no_worker_failed_and_the_good_producer_lost_nothing(
        fuzzed: Fuzzed) -> None:
    agent = fuzzed.agent
    fuzz_every_door_once_more(agent, seed=20261202)
    assert_alive(agent)
    assert metric_where(agent, "evagg_worker_errors_total") == 0, worker_failures(agent)
    report = producer_report(fuzzed.good, timeout=120)
    assert report["flushed"] and report["raised"] == 0
    assert agent.stop() == 0  # drained: every spooled event is in the lake
    try:
        # Only the good producer's own rows: the kernel stamps its pid, fuzz cannot fake it.
        rows = dict(query_lake(agent.lake_dir, f"SELECT task_id, count(*) FROM events "
                                               f"WHERE run_id = 'good' "
                                               f"AND pid = {fuzzed.good.pid} GROUP BY task_id"))
    finally:
        agent.start()  # the module's tests run in any order: some may come after this one
    assert set(rows) == {f"good-{i}" for i in range(GOOD_EVENTS)}
    assert set(rows.values()) == {1}
