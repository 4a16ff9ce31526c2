"""The HTTP sink against a real aiohttp endpoint on 127.0.0.1 (tests/sinks/flaky_server.py).

`deliver()` plays the delivery loop: write the records after the cursor, flush, and on a
failure abandon and send again from the cursor.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

import sinks.http.sink
from sinks.backoff import backoff_delay
from sinks.filters import EventFilter
from sinks.http import HttpOptions, HttpSink
from sinks.http.deadletter import list_dead_letters
from sinks.http.failures import failure_for_status, parse_retry_after
from sinks.http.retries import BATCH_BACKOFF_BASE_S, DOWN_AFTER, retried_here
from sinks.options import SinkOptionError
from sinks.records import SpoolRecord
from tests.sinks.flaky_server import FlakyServer
from tests.sinks.http.records import deliver, make_records, record_row
from tests.sinks.http.through_loop import resent_after_stored

SECRET = "Bearer s3cr3t-t0ken-value"


def run(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body with a started FlakyServer (its first argument), stopped
    afterwards; the other arguments stay pytest fixtures."""
    signature = inspect.signature(test)

    def wrapper(**fixtures: Any) -> None:
        async def main() -> None:
            server = await FlakyServer().start()
            try:
                await test(server, **fixtures)
            finally:
                await server.stop()

        asyncio.run(main())

    wrapper.__name__ = test.__name__
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:])
    return wrapper


def sink_for(server: FlakyServer, tmp: Path | None = None,
             event_filter: EventFilter | None = None, **options: Any) -> HttpSink:
    """A sink to `server` with these HttpOptions fields (timeout 5 s unless given)."""
    options.setdefault("timeout_s", 5.0)
    return HttpSink("collector", server.url, HttpOptions(**options), spool_id="spool-a",
                    event_filter=event_filter, dead_letter_dir=(tmp or Path("unused")) / "dlq")


def sink_from_table(url: str, table: dict[str, Any]) -> HttpSink:
    """A sink built from a [[sinks]] table's options, as the agent builds it."""
    return HttpSink("c", url, HttpOptions.from_table(table), spool_id="s")


@run
async def test_ndjson_batches_arrive_with_every_event(server: FlakyServer) -> None:
    records = make_records(5, 100)
    sink = sink_for(server, batch_max_events=200)
    assert await deliver(sink, records) == []
    await sink.close()
    assert sorted(len(s.events) for s in server.requests) == [100, 200, 200]
    assert {s.content_type for s in server.requests} == {"application/x-ndjson"}
    assert len(server.event_ids) == 500
    first = next(e for s in server.requests for e in s.events if e["step"] == 0)
    assert first["kind"] == "task" and first["metrics"] == {"loss": 0.0}
    assert first["attrs"] == {"rank": "0"} and first["pid"] == 42
    assert first["time"].endswith("Z") and len(first["time"]) == 30  # RFC 3339, 9 digits
    assert "parent_id" not in first  # absent values are absent keys
    assert sink.metrics()["events_sent"] == 500 and sink.metrics()["requests_2xx"] == 3


@run
async def test_json_array_with_gzip_is_decoded_by_the_server(server: FlakyServer) -> None:
    sink = sink_for(server, body_format="json", gzip=True, batch_max_events=250)
    assert await deliver(sink, make_records(4, 100)) == []
    await sink.close()
    assert {(s.content_type, s.content_encoding) for s in server.requests} == {
        ("application/json", "gzip")}
    assert sorted(len(s.events) for s in server.requests) == [150, 250]
    assert len(server.event_ids) == 400
    assert all(s.wire_bytes * 3 < len(s.body) for s in server.requests)  # compressed on the wire
    assert sink.metrics()["bytes_sent"] == sum(s.wire_bytes for s in server.requests)


@run
async def test_batches_split_records_by_count_with_distinct_keys(server: FlakyServer) -> None:
    sink = sink_for(server, batch_max_events=100)
    assert await deliver(sink, make_records(2, 250)) == []
    await sink.close()
    assert [len(s.events) for s in server.requests] == [100, 100, 100, 100, 100]
    assert len(server.batches()) == 5 and len(server.event_ids) == 500


def test_a_large_write_is_encoded_and_sent_in_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sinks.http.sink, "ENCODE_GROUP_EVENTS", 25)  # 10 records -> 4 groups

    @run
    async def check(server: FlakyServer) -> None:
        sink = sink_for(server, batch_max_events=10)
        groups: list[list[int]] = []
        take = sink._take_records

        def counted(records: Sequence[SpoolRecord]) -> None:
            groups.append([r.offset for r in records])
            take(records)

        monkeypatch.setattr(sink, "_take_records", counted)
        assert await deliver(sink, make_records(10, 10)) == []
        await sink.close()
        assert groups == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
        assert len(server.event_ids) == 100 and len(server.requests) == 10

    check()


@run
async def test_batches_are_cut_by_bytes(server: FlakyServer) -> None:
    sink = sink_for(server, batch_max_bytes=4000)
    assert await deliver(sink, make_records(3, 100)) == []
    await sink.close()
    assert all(len(s.body) <= 4000 for s in server.requests)
    assert len(server.requests) > 3 and len(server.event_ids) == 300


@run
async def test_a_partial_batch_waits_for_its_interval(server: FlakyServer) -> None:
    sink = sink_for(server, batch_interval_s=1.0)
    written = time.monotonic()  # no later than the batch's own start
    result = await sink.write(make_records(1, 10))
    assert result.ok and result.durable_through is None
    assert (await sink.flush()).durable_through is None and server.requests == []
    deadline = written + 30
    while result.durable_through is None:  # flushes as the delivery loop makes them
        assert time.monotonic() < deadline, "the partial batch was never sent"
        await asyncio.sleep(0.02)
        result = await sink.flush()
    assert result.durable_through == 1 and result.delivered_events == 10
    assert len(server.requests) == 1
    # sent once its interval was up, not at one of the flushes before: a lower bound,
    # which a slow machine only makes later
    assert server.requests[0].arrived - written >= 1.0
    await sink.close()


@run
async def test_a_failed_batch_is_resent_alone_with_the_same_key(server: FlakyServer) -> None:
    server.answer(500)
    sink = sink_for(server, batch_max_events=100)
    failures = await deliver(sink, make_records(3, 100))
    await sink.close()
    assert failures == []  # the sink retried the batch itself; the loop saw no failure
    first_key = server.requests[0].key
    assert [s.status for s in server.batches()[first_key]] == [500, 200]
    assert len(server.requests) == 4 and len({s.body for s in server.batches()[first_key]}) == 1
    assert sink.metrics()["retries"] == 1 and len(server.event_ids) == 300


@run
async def test_a_request_in_flight_is_not_cancelled_when_the_others_fail(
        server: FlakyServer) -> None:
    slow = asyncio.Event()  # the first batch is answered only once the sink is down
    server.answer_when(lambda events: events[0]["step"] < 10, 200, hold=slow)
    server.answer(500, times=DOWN_AFTER)  # every request but the slow one: the sink is down

    async def release_once_down() -> None:
        while sum(s.status == 500 for s in server.requests) < DOWN_AFTER:
            await asyncio.sleep(0.01)
        slow.set()

    releasing = asyncio.create_task(release_once_down())
    sink = sink_for(server, batch_max_events=10)
    try:
        failures = await deliver(sink, make_records(5, 10))
        await asyncio.wait_for(releasing, 30)
    finally:
        slow.set()  # a failing test must not leave the server's handler waiting for ever
        await sink.close()
    assert [f.error_kind for f in failures] == ["http_5xx"]  # the loop backed off once...
    first = [s for s in server.requests if s.events[0]["step"] == 0]
    assert [s.status for s in first] == [200]  # ...and the slow batch, answered, never again
    assert len(server.event_ids) == 50 and server.accepted_events == 50


@run
async def test_a_batch_cut_by_time_keeps_its_rows_and_key_on_resend(server: FlakyServer) -> None:
    records = make_records(3, 10)
    sink = sink_for(server, batch_interval_s=0.01, batch_max_events=1000)
    server.answer(503, times=DOWN_AFTER)  # down: the failure goes to the loop
    await sink.write(records[:1])
    await asyncio.sleep(0.02)
    result = await sink.flush(final=True)
    assert result.error_kind == "http_5xx"
    await sink.abandon()
    assert await deliver(sink, records) == []  # resend from the cursor with more records
    await sink.close()
    batches = server.batches()
    retried = batches[server.requests[0].key]
    assert [s.status for s in retried] == [503] * DOWN_AFTER + [200]
    assert len(retried[-1].events) == 10  # the same rows as the first try, not 30


@run
async def test_keys_are_the_same_after_a_restart(server: FlakyServer) -> None:
    records = make_records(4, 50)
    for _ in range(2):  # a new sink object per "agent process"
        sink = sink_for(server, batch_max_events=100)
        assert await deliver(sink, records) == []
        await sink.close()
    keys = [s.key for s in server.requests]
    assert keys[:2] == keys[2:] and len(set(keys)) == 2
    assert server.accepted_events == 400 and len(server.event_ids) == 200


@run
async def test_durable_through_waits_for_an_earlier_slow_batch(server: FlakyServer) -> None:
    sink = sink_for(server, batch_max_events=10, max_in_flight=4)
    # The first batch (steps 0-9) is answered only when the test says, the next three at once.
    slow = asyncio.Event()
    server.answer_when(lambda events: events[0]["step"] < 10, 200, hold=slow)
    try:
        result = await sink.write(make_records(4, 10))
        for _ in range(200):
            if len(server.requests) >= 3:
                break
            await asyncio.sleep(0.01)
        assert len(server.requests) == 3  # batches 2-4 acknowledged, batch 1 still pending
        assert result.durable_through is None
        assert (await sink.flush()).durable_through is None
    finally:
        slow.set()  # a failing test must not leave the server's handler waiting for ever
    result = await sink.flush(final=True)
    assert result.durable_through == 4 and result.delivered_events == 40
    await sink.close()


@run
async def test_batches_acknowledged_after_a_failed_one_are_not_sent_again(
        server: FlakyServer) -> None:
    records = make_records(4, 10)
    second = {e["step"] for e in [record_row(i) for i in range(10, 20)]}
    server.answer_when(lambda events: events[0]["step"] in second, 500, delay_s=0.3)
    sink = sink_for(server, batch_max_events=10, max_in_flight=4)
    failures = await deliver(sink, records)
    await sink.close()
    assert failures == []
    statuses = {key: [s.status for s in seen] for key, seen in server.batches().items()}
    assert sorted(statuses.values()) == [[200], [200], [200], [500, 200]]
    assert sink.metrics()["retries"] == 1 and server.accepted_events == 40


@run
async def test_a_failure_after_a_batch_that_ended_inside_a_record_sends_no_row_twice(
        server: FlakyServer) -> None:
    """Batches of 100 over records of 150: the second batch ends inside the second record,
    where the cursor (whole records) stops. A failure after it makes the loop read again
    from that record: its rows the second batch delivered must not go again under a new key."""
    records = make_records(4, 150)
    third = {e["step"] for e in [record_row(i) for i in range(200, 300)]}
    server.answer_when(lambda events: events[0]["step"] in third, 400)  # permanent: the loop's
    sink = HttpSink("c", server.url, HttpOptions(batch_max_events=100, max_in_flight=1),
                    spool_id="s")
    failures = await deliver(sink, records)
    await sink.close()
    assert [f.error_kind for f in failures] == ["http_4xx"]
    stored = [s for s in server.requests if s.stored]
    steps = [e["step"] for s in stored for e in s.events]
    assert sorted(steps) == list(range(600))  # every row once
    sent = [(s.key, s.status) for s in server.requests]
    assert len({key for key, _ in sent}) == 6  # 600 rows in six batches, one key each


@run
async def test_a_permanent_4xx_without_a_dead_letter_directory_stops_the_sink(
        server: FlakyServer) -> None:
    server.answer(400)
    sink = HttpSink("c", server.url, spool_id="s")
    await sink.write(make_records(1, 5))
    result = await sink.flush(final=True)
    await sink.close()
    assert (result.error_kind, result.permanent, result.durable_through) == ("http_4xx", True, None)


@run
async def test_a_redirect_is_not_followed(server: FlakyServer) -> None:
    server.answer(307)
    sink = sink_for(server)
    await sink.write(make_records(1, 5))
    result = await sink.flush(final=True)
    await sink.close()
    assert (result.error_kind, result.permanent) == ("http_status", True)
    assert len(server.requests) == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_refusals_lose_nothing_and_keep_keys_stable(seed: int, tmp_path: Path) -> None:
    @run
    async def check(server: FlakyServer) -> None:
        rng = random.Random(seed)
        for _ in range(40):
            server.answer(rng.choice([200, 200, 200, 500, 503, 429, 400]))
        records = make_records(30, 7)
        sink = sink_for(server, tmp_path, batch_max_events=10, max_in_flight=3)
        await deliver(sink, records, attempts=200)
        await sink.close()
        assert {s.status for s in server.requests} > {200}  # the script did refuse things
        assert resent_after_stored(server) == []
        dead = {orjson.loads(line)["event_id"] for letter in list_dead_letters(tmp_path / "dlq")
                for line in letter.body_path.read_bytes().splitlines()}
        assert len(server.event_ids | dead) == 210  # every event delivered or kept
        keys_of: dict[str, set[str]] = {}
        for stored in (s for s in server.requests if s.stored):
            for event in stored.events:
                keys_of.setdefault(event["event_id"], set()).add(stored.key)
        assert [k for k in keys_of.values() if len(k) > 1] == []  # one key per event, ever
        for key, seen in server.batches().items():  # a key always names the same rows
            # (a batch resent after the loop backed off is encoded again, and the padding
            # between columns follows the other rows encoded with it: compare rows)
            assert all(s.events == seen[0].events for s in seen), key

    check()


@pytest.mark.parametrize(("status", "kind", "retry_after", "expected"), [
    (500, "http_5xx", None, None),
    (503, "http_5xx", "7", 7.0),
    (429, "throttled", "3", 3.0),
    (408, "timeout", None, None),
])
def test_each_passing_status_is_a_failure_the_sink_retries(
        status: int, kind: str, retry_after: str | None, expected: float | None) -> None:
    failure = failure_for_status(status, parse_retry_after(retry_after))
    assert failure is not None and failure.error_kind == kind
    assert failure.retry_after_s == expected and not failure.permanent
    assert retried_here(failure)


@pytest.mark.parametrize("status", [500, 503, 429, 408])
def test_an_endpoint_answering_only_failures_is_down_after_a_few_requests(status: int) -> None:
    @run
    async def check(server: FlakyServer) -> None:
        server.answer(status, times=None)
        sink = sink_for(server)
        assert (await sink.write(make_records(1, 5))).ok  # buffered, the batch is not due yet
        result = await sink.flush(final=True)
        await sink.close()
        assert not result.ok and not result.permanent
        assert len(server.requests) == DOWN_AFTER

    check()


@run
async def test_retry_after_as_an_http_date_holds_the_batch_back(server: FlakyServer) -> None:
    # An HTTP date names a whole second. Made as the 429 leaves, 2 s past the current
    # second is 1 to 2 s ahead, whatever the fraction of a second it is and however long
    # the sink took to send (made before, the date could pass before it was answered).
    server.answer(429, retry_after=lambda: formatdate(math.floor(time.time()) + 2,
                                                      usegmt=True))
    sink = sink_for(server)
    assert await deliver(sink, make_records(1, 5)) == []
    await sink.close()
    throttled, accepted = server.requests
    assert (throttled.status, accepted.status) == (429, 200)
    held_until = parsedate_to_datetime(throttled.retry_after).timestamp()
    # ahead by more than the sink's own first backoff (under BATCH_BACKOFF_BASE_S): a sink
    # that ignored the date came back before it
    assert held_until - throttled.answered_at > BATCH_BACKOFF_BASE_S, throttled
    # and no sooner than that second, on the date's own clock (the server's time.time())
    assert accepted.arrived_at >= held_until, (accepted.arrived_at, held_until)


@run
async def test_an_auth_refusal_is_permanent_and_keeps_the_data(server: FlakyServer) -> None:
    server.answer(401)
    sink = sink_for(server)
    await sink.write(make_records(1, 5))
    result = await sink.flush(final=True)
    await sink.close()
    assert result.error_kind == "http_auth" and result.permanent
    assert result.durable_through is None


@run
async def test_a_stalled_endpoint_is_a_timeout(server: FlakyServer) -> None:
    server.stall(2.0)
    sink = sink_for(server, timeout_s=0.2)
    await sink.write(make_records(1, 5))
    result = await sink.flush(final=True)
    await sink.close()
    assert result.error_kind == "timeout" and sink.metrics()["timeouts"] == DOWN_AFTER


@run
async def test_a_refused_connection_is_a_connect_failure_then_recovers(server: FlakyServer) -> None:
    await server.stop()
    sink = sink_for(server)
    records = make_records(2, 5)
    result = await sink.write(records)
    result = await sink.flush(final=True) if result.ok else result
    assert result.error_kind == "connect" and sink.metrics()["connect_errors"] == DOWN_AFTER
    await sink.abandon()
    await server.start()
    assert await deliver(sink, records) == []
    await sink.close()
    assert len(server.event_ids) == 10


@run
async def test_a_permanent_4xx_goes_to_the_dead_letter_directory(server: FlakyServer,
                                                                  tmp_path: Path) -> None:
    server.answer(400, text="field x is bad")
    sink = sink_for(server, tmp_path, batch_max_events=5)
    assert await deliver(sink, make_records(2, 5)) == []  # the cursor passes the refused batch
    await sink.close()
    letters = list_dead_letters(tmp_path / "dlq")
    assert len(letters) == 1
    letter = letters[0]
    assert (letter.status, letter.events, letter.response) == (400, 5, "field x is bad")
    assert letter.key == server.requests[0].key and letter.url == server.url
    assert letter.body_path.read_bytes() == server.requests[0].body
    assert sink.metrics()["dead_lettered_events"] == 5 and len(server.event_ids) == 5


@run
async def test_a_record_that_cannot_be_decoded_is_a_failure_not_an_exception(
        server: FlakyServer) -> None:
    good = make_records(1, 5)[0]
    bad = SpoolRecord(2, bytes(16), 1, 0, 5, b"\x00garbage" * 10)
    sink = sink_for(server)
    result = await sink.write([good, bad])
    await sink.close()
    assert (result.ok, result.error_kind, result.permanent) == (False, "encode", True)
    assert server.requests == []


@run
async def test_filters_select_by_kind_source_and_name(server: FlakyServer) -> None:
    sink = sink_for(server, event_filter=EventFilter.of(kinds=["task", "op"], sources=["ray"],
                                                        names=["step_0", "step_2"]))
    assert await deliver(sink, make_records(3, 30)) == []
    await sink.close()
    events = [e for s in server.requests for e in s.events]
    assert events and all(e["kind"] in ("task", "op") and e["source"] == "ray" for e in events)
    assert {e["name"] for e in events} <= {"step_0", "step_2"}
    expected = [record_row(i) for i in range(90)]
    assert len(events) == sum(1 for r in expected if r["kind"] in ("task", "op")
                              and r["source"] == "ray" and r["name"] in ("step_0", "step_2"))


@run
async def test_records_the_filter_drops_entirely_still_advance_the_cursor(
        server: FlakyServer) -> None:
    sink = sink_for(server, event_filter=EventFilter.of(kinds=["nothing-like-this"]))
    result = await sink.write(make_records(3, 10))
    await sink.close()
    assert result.durable_through == 3 and result.delivered_events == 0
    assert server.requests == []


@run
async def test_header_values_come_from_env_and_file(server: FlakyServer,
                                                    tmp_path: Path) -> None:
    (tmp_path / "token").write_text(SECRET + "\n")
    os.environ["EVAGG_TEST_TENANT"] = "tenant-7"
    try:
        options = HttpOptions.from_table({"headers": {
            "Authorization": f"file:{tmp_path / 'token'}", "X-Tenant": "env:EVAGG_TEST_TENANT",
            "X-Plain": "x"}})
        sink = HttpSink("collector", server.url, options, spool_id="spool-a")
    finally:
        del os.environ["EVAGG_TEST_TENANT"]
    assert await deliver(sink, make_records(1, 3)) == []
    await sink.close()
    headers = server.requests[0].headers
    assert headers["Authorization"] == SECRET and headers["X-Tenant"] == "tenant-7"
    assert headers["X-Plain"] == "x" and headers["Idempotency-Key"] == server.requests[0].key


def test_an_unreadable_header_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    with pytest.raises(SinkOptionError, match=r"headers: 'Authorization': cannot read file"):
        HttpOptions.from_table({"headers": {"Authorization": f"file:{missing}"}})
    with pytest.raises(SinkOptionError, match="EVAGG_TEST_UNSET_VARIABLE is not set"):
        HttpOptions.from_table({"headers": {"X-Key": "env:EVAGG_TEST_UNSET_VARIABLE"}})


@pytest.mark.parametrize(("options", "message"), [
    ({"url": "ftp://host/x"}, "url must be an http"),
    ({"format": "xml"}, "format: 'xml' is not one of ndjson, json"),
    ({"batch_max_events": 0}, "batch_max_events: 0 must be at least 1"),
    ({"batch_interval": "0s"}, "batch_interval: "),
    ({"max_in_flight": 0}, "max_in_flight: 0 must be at least 1"),
    ({"headers": {"X": "a\r\nInjected: 1"}}, "headers: 'X': a header cannot contain a line"),
    ({"url": "http://u:p@127.0.0.1/x", "headers": {"Authorization": "x"}}, "user info"),
    ({"no_such_option": 1}, "no_such_option: is not an option of an http sink"),
    ({"headers": {"X": 5}}, "headers: 'X': the value must be a string"),
    ({"headers": {"Bad Name": "v"}}, "name must be a token"),
    ({"gzip_level": 12}, "gzip_level: 12 is not a zlib level from -1 to 9"),
    ({"gzip": "yes please"}, "gzip: "),
    ({"concurrency": "fast"}, "concurrency: 'fast' is neither \"adaptive\" nor a number"),
    ({"concurrency": 0}, "concurrency: 0 must be at least 1"),
    ({"concurrency": 8}, r"concurrency: 8 is more than max_in_flight \(4\)"),
])
def test_bad_options_are_config_errors(options: dict[str, Any], message: str) -> None:
    url = options.pop("url", "http://127.0.0.1:9/x")
    with pytest.raises(ValueError, match=message):
        sink_from_table(url, options)


@run
async def test_a_fixed_concurrency_keeps_that_many_requests_in_flight(server: FlakyServer) -> None:
    server.answer(429, times=3)  # pushback that would cut an adaptive limit
    server.answer(200, times=None, delay_s=0.2)
    sink = sink_for(server, batch_max_events=10, max_in_flight=8, concurrency=3)
    assert await deliver(sink, make_records(12, 10)) == []
    await sink.close()
    assert server.most_in_flight == 3 and sink.gauges()["concurrency_limit"] == 3
    assert "3 in flight" in sink.describe() and len(server.event_ids) == 120


def test_secrets_never_appear_in_describe_repr_or_logs(caplog: pytest.LogCaptureFixture,
                                                       tmp_path: Path) -> None:
    caplog.set_level(logging.DEBUG)

    @run
    async def body(server: FlakyServer) -> None:
        server.answer(400)
        server.answer(500)
        sink = HttpSink("c", server.url + "?token=abc",
                        HttpOptions(headers={"Authorization": SECRET}, batch_max_events=5),
                        spool_id="s", dead_letter_dir=tmp_path / "dlq")
        assert await deliver(sink, make_records(2, 5)) == []  # the 500 retried in the sink
        basic = HttpSink("b", server.url.replace("http://", "http://user:hunter2@"),
                         spool_id="s")
        texts = [sink.describe(), repr(sink), str(sink.metrics()), basic.describe(), repr(basic)]
        await sink.close()
        for letter in list_dead_letters(tmp_path / "dlq"):
            texts.append(letter.meta_path.read_text())
        ours = [r.getMessage() for r in caplog.records  # the test server's access log aside
                if not r.name.startswith(("aiohttp.access", "aiohttp.server"))]
        texts.extend(ours)
        assert any("refused" in text for text in ours)  # the dead letter was logged...
        for text in texts:  # ...without the header, the URL's password or its query
            assert "s3cr3t" not in text and "hunter2" not in text and "token=abc" not in text

    body()


def test_backoff_is_full_jitter_under_an_exponential_ceiling() -> None:
    assert backoff_delay(1, rng=lambda: 1.0) == pytest.approx(0.1)
    assert backoff_delay(4, rng=lambda: 1.0) == pytest.approx(0.8)
    assert backoff_delay(4, rng=lambda: 0.5) == pytest.approx(0.4)
    assert backoff_delay(40, rng=lambda: 1.0) == 60.0  # capped
    assert backoff_delay(10_000, cap=5, rng=lambda: 0.0) == 0.0  # huge attempts do not overflow
    assert backoff_delay(1, retry_after=7.0, rng=lambda: 1.0) == 7.0  # a floor...
    assert backoff_delay(1, cap=1, retry_after=90.0, rng=lambda: 1.0) == 90.0  # ...above cap


def test_retry_after_parses_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(formatdate(now + 45, usegmt=True), now=now) == 45.0
    assert parse_retry_after(formatdate(now - 45, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("-5") is None and parse_retry_after("") is None
