"""Dead letters on disk: written whole or not at all, listed, replayed to a real endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from sinks.http import HttpOptions, HttpSink
from sinks.http.deadletter import (
    dead_letter_dir,
    list_dead_letters,
    url_for_display,
    write_dead_letter,
)
from sinks.http.replay import replay_dead_letters
from tests.sinks.flaky_server import FlakyServer
from tests.sinks.http.records import make_records

BODY = b'{"event_id":"a","kind":"task"}\n{"event_id":"b","kind":"op"}\n'


def letter(directory: Path, key: str = "k1", **overrides: Any) -> None:
    fields: dict[str, Any] = {
        "key": key, "body": BODY, "status": 400, "response": "bad", "events": 2,
        "url": "http://user:pw@127.0.0.1:1/ingest?token=t", "body_format": "ndjson",
        "sink": "collector", "first_offset": 3, "last_offset": 4}
    write_dead_letter(directory, **{**fields, **overrides})


def test_a_dead_letter_is_a_body_and_a_sidecar(tmp_path: Path) -> None:
    letter(tmp_path, response="x" * 10_000)
    [found] = list_dead_letters(tmp_path)
    assert found.body_path.read_bytes() == BODY
    assert (found.key, found.status, found.events, found.sink) == ("k1", 400, 2, "collector")
    assert (found.first_offset, found.last_offset) == (3, 4)
    assert len(found.response) == 4096  # the response text is truncated to 4 KB
    assert found.url == "http://127.0.0.1:1/ingest"  # no password, no query
    assert found.time.endswith("Z")
    meta = orjson.loads(found.meta_path.read_bytes())
    assert (meta["idempotency_key"], meta["status"], meta["events"]) == ("k1", 400, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1.meta.json", "k1.ndjson"]


def test_half_written_and_unreadable_letters_are_not_listed(tmp_path: Path) -> None:
    letter(tmp_path, "good")
    (tmp_path / "orphan.ndjson").write_bytes(BODY)  # body written, sidecar never
    (tmp_path / "broken.meta.json").write_text("{not json")
    (tmp_path / "partial.meta.json").write_text('{"key": "partial"}')
    assert [x.key for x in list_dead_letters(tmp_path)] == ["good"]
    assert list_dead_letters(tmp_path / "missing") == []


def test_writing_into_an_unusable_directory_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        letter(blocker / "dlq")


def test_url_for_display_drops_credentials() -> None:
    assert url_for_display("https://u:p@host:8443/a/b?sig=1#f") == "https://host:8443/a/b"
    assert url_for_display("http://[::1]:80/x") == "http://[::1]:80/x"


def serve(test: Any) -> Any:
    def wrapper(tmp_path: Path) -> None:
        async def main() -> None:
            server = await FlakyServer().start()
            try:
                await test(server, tmp_path)
            finally:
                await server.stop()

        asyncio.run(main())

    wrapper.__name__ = test.__name__
    return wrapper


@serve
async def test_replay_sends_with_the_original_key_and_deletes_on_2xx(server: FlakyServer,
                                                                    tmp_path: Path) -> None:
    letter(tmp_path, "k1")
    letter(tmp_path, "k2", body_format="json", body=b'[{"event_id":"c"}]', events=1)
    report = await replay_dead_letters(tmp_path, server.url, {"X-Tenant": "t"}, gzip=True)
    assert (report.sent, report.failed, report.events_sent) == (2, 0, 3)
    assert sorted(s.key for s in server.requests) == ["k1", "k2"]
    by_key = {s.key: s for s in server.requests}
    assert by_key["k1"].body == BODY and by_key["k1"].content_type == "application/x-ndjson"
    assert by_key["k2"].content_type == "application/json"
    assert by_key["k1"].content_encoding == "gzip" and by_key["k1"].headers["X-Tenant"] == "t"
    assert server.event_ids == {"a", "b", "c"}
    assert list(tmp_path.iterdir()) == []


@serve
async def test_replay_keeps_what_the_endpoint_refuses(server: FlakyServer,
                                                      tmp_path: Path) -> None:
    letter(tmp_path, "k1")
    letter(tmp_path, "k2")
    server.answer(500)
    report = await replay_dead_letters(tmp_path, server.url, keys={"k1"})
    assert (report.sent, report.failed) == (0, 1) and report.errors == ["k1: HTTP 500"]
    assert len(list_dead_letters(tmp_path)) == 2
    await server.stop()
    report = await replay_dead_letters(tmp_path, server.url, timeout_s=2)
    assert report.failed == 2 and all("Connect" in e for e in report.errors)
    assert len(list_dead_letters(tmp_path)) == 2


@serve
async def test_dead_letters_from_the_sink_replay_to_a_fixed_endpoint(server: FlakyServer,
                                                                     tmp_path: Path) -> None:
    server.answer(422, times=2)
    sink = HttpSink("collector", server.url, HttpOptions(batch_max_events=5), spool_id="s",
                    dead_letter_dir=tmp_path)
    result = await sink.write(make_records(3, 5))
    result = await sink.flush(final=True)
    await sink.close()
    assert result.durable_through == 3 and sink.metrics()["dead_lettered_batches"] == 2
    refused = [s for s in server.requests if s.status == 422]
    report = await replay_dead_letters(tmp_path, server.url)
    assert report.sent == 2 and list_dead_letters(tmp_path) == []
    replayed = server.requests[-2:]
    assert sorted(s.key for s in replayed) == sorted(s.key for s in refused)
    assert sorted(s.body for s in replayed) == sorted(s.body for s in refused)
    assert len(server.event_ids) == 15


@serve
async def test_a_dead_letter_that_cannot_be_written_keeps_the_cursor(server: FlakyServer,
                                                                      tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    server.answer(400)
    sink = HttpSink("collector", server.url, spool_id="s", dead_letter_dir=blocker / "dlq")
    await sink.write(make_records(1, 5))
    result = await sink.flush(final=True)
    await sink.close()
    assert result.error_kind == "dead_letter" and result.durable_through is None


def test_the_documented_folder_is_where_the_agent_keeps_them() -> None:
    # operators script around the path docs/sinks-http.md gives
    doc = (Path(__file__).resolve().parents[3] / "docs" / "sinks-http.md").read_text()
    documented = doc.split("(the agent uses `", 1)[1].split("`", 1)[0]
    assert documented == str(dead_letter_dir(Path("<state_dir>"), "<sink name>")) + "/"
