"""Compressed HTTP bodies on a real agent: gzip and deflate read, br and zstd refused with
415 and the reason (not aiohttp's "Please install `Brotli`"), broken or bombing streams
refused and nothing of them stored."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable

import orjson
import pytest

from tests.agentproc import AgentProcess


def post(agent: AgentProcess, path: str, body: bytes, encoding: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{agent.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson",
                                              "Content-Encoding": encoding})
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


PACKERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress), "deflate": ("deflate", zlib.compress),
    "raw deflate": ("deflate", raw_deflate),
}


@pytest.mark.parametrize("packing", sorted(PACKERS))
def test_a_compressed_body_is_read_and_stored(agent: AgentProcess, packing: str) -> None:
    encoding, pack = PACKERS[packing]
    lines = b"".join(orjson.dumps({"kind": "op", "name": f"packed-{i}"}) + b"\n"
                     for i in range(3))
    status, body = post(agent, "/v1/events", pack(lines), encoding)
    assert status == 200 and orjson.loads(body)["accepted"] == 3, body
    rows = agent.wait_rows("SELECT name FROM events WHERE name LIKE 'packed-%'", 3)
    assert sorted(r[0] for r in rows) == ["packed-0", "packed-1", "packed-2"]


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_br_and_zstd_are_415_naming_what_to_send(agent: AgentProcess, encoding: str) -> None:
    for path in ("/v1/events", "/ray/events"):
        status, body = post(agent, path, b"\x0b\x02\x80{}\x03", encoding)
        assert status == 415, (path, body)
        assert f"Content-Encoding '{encoding}' is not supported" in orjson.loads(body)["error"]
        assert "gzip, deflate or none" in orjson.loads(body)["error"]
    assert agent.metric('evagg_bad_input_total{reason="bad_encoding"') == 2


def test_a_broken_or_bombing_stream_is_refused_and_nothing_stored(
        agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(agent_toml='http_max_body = "1MiB"').start()
    status, body = post(agent, "/v1/events", b"\x1f\x8b\x08 not gzip at all", "gzip")
    assert status == 400 and "cannot read the body: invalid gzip data" in str(body)
    good = gzip.compress(orjson.dumps({"kind": "op", "name": "cut"}) + b"\n")
    status, body = post(agent, "/v1/events", good[:-6], "gzip")
    assert status == 400 and "truncated gzip data" in str(body)
    bomb = gzip.compress(b" " * (2 << 20))  # 2 MiB of spaces in about 2 KiB
    status, body = post(agent, "/v1/events", bomb, "gzip")
    assert status == 413 and "inflates past 1048576 bytes" in str(body)
    assert agent.metric('evagg_bad_input_total{reason="too_large"') == 1
    # nothing of them received: the agent's own heartbeats (its start heartbeat is spooled
    # before it is ready) are all there is
    heartbeats = agent.metric('evagg_received_events_total{route="agent"}')
    assert heartbeats >= 1 and agent.metric("evagg_received_events_total") == heartbeats
