"""Retries per batch and a concurrency that follows the endpoint, through the agent's
real delivery loop (tests/sinks/http/through_loop.py) against real aiohttp endpoints on
loopback: an endpoint's trouble costs a retry of the batch it hit, never a resend of the
window, and an endpoint that pushes back gets fewer requests, not more."""

from __future__ import annotations

import itertools
from pathlib import Path

from sinks.http import HttpOptions, HttpSink
from sinks.http.retries import DOWN_AFTER
from tests.sinks.flaky_server import ONE_IN_THREE, RESET, FlakyServer
from tests.sinks.http.records import make_records
from tests.sinks.http.through_loop import LoopRun, first_steps, resent_after_stored, serve


def sink_for(server: FlakyServer, tmp: Path, **options: object) -> HttpSink:
    return HttpSink("collector", server.url, HttpOptions(**options),  # type: ignore[arg-type]
                    spool_id="spool-a", dead_letter_dir=tmp / "dlq")


@serve
async def test_one_failure_in_three_costs_one_retry_of_that_batch_only(
        server: FlakyServer, tmp_path: Path) -> None:
    records = make_records(30, 200)  # 30 batches of 200 events
    healthy = await LoopRun.start(sink_for(server, tmp_path / "a", batch_max_events=200),
                                  records, tmp_path / "a")
    healthy_s = await healthy.finish()
    server.requests.clear()
    server.event_ids.clear()
    server.accepted_events = 0

    server.rotate(ONE_IN_THREE)
    run = await LoopRun.start(sink_for(server, tmp_path / "b", batch_max_events=200),
                              records, tmp_path / "b")
    flaky_s = await run.finish()
    print(f"\nhealthy endpoint {healthy_s:.2f}s, one failure in three {flaky_s:.2f}s, "
          f"{len(server.requests)} requests for {len(server.batches())} batches")

    assert len(server.event_ids) == 6000  # every event arrived
    assert resent_after_stored(server) == []  # no batch answered 2xx was sent again
    assert server.accepted_events == 6000  # and so no duplicate at the receiver
    assert len(server.requests) <= 1.7 * len(server.batches())
    # The loop never backed off: each failure was one batch's retry, inside the sink.
    assert run.metrics.delivery_errors.values == {}
    assert run.consumer.state.failures_in_a_row == 0
    for seen in server.batches().values():  # a 429's Retry-After held back that batch alone
        for failed, again in itertools.pairwise(seen):
            if failed.status == 429:
                assert again.arrived - failed.answered >= 0.95
    assert run.sink.metrics()["retries"] == len(server.requests) - len(server.batches())


@serve
async def test_an_endpoint_shedding_load_for_ten_seconds_gets_few_requests(
        server: FlakyServer, tmp_path: Path) -> None:
    records = make_records(20, 100)
    sink = sink_for(server, tmp_path, batch_max_events=100)
    server.answer_for(10.0, 429)
    run = await LoopRun.start(sink, records, tmp_path, backoff_cap_s=5.0)
    elapsed = await run.finish(timeout_s=60)
    outage = [s for s in server.requests if s.status == 429]
    print(f"\n{len(outage)} requests during the 10 s outage, delivered after {elapsed:.1f}s, "
          f"concurrency limits seen {sorted(set(run.limits))}")

    assert len(outage) <= 20  # not a retry storm: 20 batches were waiting all along
    assert all(s.in_flight == 1 for s in outage[DOWN_AFTER:])  # the concurrency fell to one
    assert min(run.limits) == 1
    gaps = [b.arrived - a.arrived for a, b in zip(outage[DOWN_AFTER:], outage[DOWN_AFTER + 1:],
                                                  strict=False)]
    assert max(gaps) > 1.0  # the loop's backoff grew while every request failed
    stored = [s for s in server.requests if s.stored]
    assert server.accepted_events == len(server.event_ids) == 2000  # all of it, once
    assert first_steps(stored)[0] == 0  # picked up at the cursor, in the spool's order
    assert sorted(first_steps(stored)) == list(range(0, 2000, 100))
    assert resent_after_stored(server) == []


@serve
async def test_a_slow_endpoint_gets_max_in_flight_and_throughput_follows(
        server: FlakyServer, tmp_path: Path) -> None:
    server.answer(200, times=None, delay_s=2.0)
    sink = sink_for(server, tmp_path, batch_max_events=100, max_in_flight=4)
    # 18 batches: waves of 2, 3, 4, 4, 4, 1 as the limit grows, so one split wave still
    # leaves two of four.
    run = await LoopRun.start(sink, make_records(18, 100), tmp_path)
    elapsed = await run.finish(timeout_s=90)
    waves: list[list[float]] = []  # requests sent together, answered together
    for arrived in sorted(s.arrived for s in server.requests):
        if not waves or arrived - waves[-1][0] > 1.0:
            waves.append([])
        waves[-1].append(arrived)
    print(f"\n{len(server.requests)} batches in {elapsed:.1f}s, limits seen "
          f"{sorted(set(run.limits))}, requests sent in waves of {[len(w) for w in waves]}")
    assert max(run.limits) == 4 and server.most_in_flight == 4
    sizes = [len(wave) for wave in waves]
    assert sizes[0] <= 2  # it started small...
    assert sizes.count(4) >= 2  # ...and ended four at a time, every 2 s: twice the rate
    assert len(server.requests) == 18 and len(server.event_ids) == 1800


@serve
async def test_a_body_stored_before_the_connection_dropped_is_resent_once_with_its_key(
        server: FlakyServer, tmp_path: Path) -> None:
    server.reset_after_store(1)
    sink = sink_for(server, tmp_path, batch_max_events=100)
    run = await LoopRun.start(sink, make_records(5, 100), tmp_path)
    await run.finish()
    first = server.requests[0]
    again = server.batches()[first.key]
    assert [s.status for s in again] == [RESET, 200]  # sent twice: the answer was lost
    assert again[0].body == again[1].body  # the same rows under the same key
    assert all(len(seen) == 1 for key, seen in server.batches().items() if key != first.key)
    # the receiver holds that batch twice; deduping on the key (or event_id) leaves one
    assert server.accepted_events == 600 and len(server.event_ids) == 500
    assert run.sink.metrics()["connect_errors"] == 1 and run.sink.metrics()["retries"] == 1


@serve
async def test_one_success_ends_the_loops_failure_run_before_the_cursor_moves(
        server: FlakyServer, tmp_path: Path) -> None:
    server.answer(500, times=DOWN_AFTER)  # every request fails: the sink is down
    first_batch_seen = 0

    def second_try_of_the_first_batch(events: list[dict[str, object]]) -> bool:
        nonlocal first_batch_seen
        first_batch_seen += events[0]["step"] == 0
        return first_batch_seen == 2

    # When the loop tries again the first batch is answered slowly: the cursor cannot
    # move for 2 s, but the batches after it are answered at once.
    server.answer_when(second_try_of_the_first_batch, 200, delay_s=2.0)
    sink = sink_for(server, tmp_path, batch_max_events=100)
    run = await LoopRun.start(sink, make_records(6, 100), tmp_path, backoff_cap_s=0.5)
    await run.until(lambda: run.consumer.state.failures_in_a_row >= 1, 30, "the sink down")
    await run.until(lambda: run.consumer.state.failures_in_a_row == 0, 10,
                    "one success to reset the failure count")
    assert run.spool.cursor("collector") == 1  # nothing delivered in order, yet not down
    assert len([s for s in server.requests if s.status == 200]) >= 1
    await run.finish()
    assert len(server.event_ids) == 600 and resent_after_stored(server) == []


@serve
async def test_every_request_failing_goes_to_the_loop_after_a_few(
        server: FlakyServer, tmp_path: Path) -> None:
    server.answer(503, times=None)
    sink = sink_for(server, tmp_path, batch_max_events=10)
    await sink.write(make_records(8, 10))
    result = await sink.flush(final=True)
    assert (result.ok, result.error_kind) == (False, "http_5xx")
    assert len(server.requests) == DOWN_AFTER  # not one request per batch, not a storm
    await sink.abandon()
    await sink.write(make_records(8, 10))  # the loop's next attempt: still down
    result = await sink.flush(final=True)
    assert not result.ok and len(server.requests) == DOWN_AFTER + 1  # one more probe
    await sink.close()


@serve
async def test_retries_count_the_requests_sent_again_through_an_outage(
        server: FlakyServer, tmp_path: Path) -> None:
    # The endpoint is down long enough for the delivery loop to try several times, then
    # recovers: `retries` (evagg status's "retried N batches") is the requests that went
    # out again under a key already sent, not every time the loop cut a batch again.
    server.answer_for(3.0, 503)
    run = await LoopRun.start(sink_for(server, tmp_path, batch_max_events=10),
                              make_records(8, 10), tmp_path, backoff_cap_s=0.5)
    await run.finish()
    assert run.consumer.state.failures_in_a_row == 0
    assert len(run.metrics.delivery_errors.values) >= 1  # the loop itself backed off
    sent_again = len(server.requests) - len(server.batches())
    assert sent_again >= 1
    assert run.sink.metrics()["retries"] == sent_again


@serve
async def test_a_wrong_path_keeps_the_events_spooled_until_the_url_is_fixed(
        server: FlakyServer, tmp_path: Path) -> None:
    # A 404 says the URL is wrong, not the batch: nothing is dead-lettered, the sink fails
    # permanently (status: "failing (http_url)"), and the events wait in the spool for the
    # fixed url (a reload sends them: tests/aggregator/test_lifecycle.py reloads sinks).
    server.answer(404, times=None)
    run = await LoopRun.start(sink_for(server, tmp_path, batch_max_events=10),
                              make_records(3, 10), tmp_path, backoff_cap_s=0.5)
    await run.until(lambda: run.consumer.state.failures_in_a_row >= 1, 30, "the sink to fail")
    assert run.consumer.state.last_error_kind == "http_url"
    assert run.sink.metrics().get("dead_lettered_batches", 0) == 0
    assert not list((tmp_path / "dlq").glob("*"))
    assert not run.delivered() and server.accepted_events == 0
    await run.stop()
