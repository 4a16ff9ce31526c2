"""The HTTP sink's concurrency limit on its own: additive increase while every slot is
used and answers are healthy, multiplicative decrease on pushback or a slowdown, once
per round trip; a fixed limit never moves. A clock the test advances stands in for time.
And a batch's own retry state: its backoff, and when the endpoint counts as down."""

from __future__ import annotations

import asyncio

import pytest

from sinks.base import SinkResult
from sinks.http.concurrency import INITIAL_LIMIT, Answer, ConcurrencyLimit, Ticket
from sinks.http.retries import DOWN_AFTER, BatchRetry, FailureStreak, retried_here


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limited(maximum: int = 8, fixed: int | None = None) -> tuple[ConcurrencyLimit, Clock]:
    clock = Clock()
    return ConcurrencyLimit(maximum, fixed=fixed, clock=clock), clock


async def full_round(limit: ConcurrencyLimit, clock: Clock, answer: Answer,
                     took_s: float = 0.01) -> None:
    """Fill every slot, then answer each request `took_s` later with `answer`."""
    tickets = [await limit.acquire() for _ in range(limit.limit)]
    clock.now += took_s
    for ticket in tickets:
        limit.release(ticket, answer)


def test_it_starts_small_and_grows_by_one_per_round_of_healthy_answers() -> None:
    async def main() -> None:
        limit, clock = limited(maximum=5)
        assert limit.limit == INITIAL_LIMIT == 2
        seen = []
        for _ in range(5):
            await full_round(limit, clock, Answer.HEALTHY)
            seen.append(limit.limit)
        assert seen == [3, 4, 5, 5, 5]  # one per round, never above max_in_flight

    asyncio.run(main())


def test_answers_to_requests_that_never_filled_the_slots_do_not_grow_it() -> None:
    async def main() -> None:
        limit, clock = limited()
        for _ in range(10):  # one request at a time: no evidence the endpoint takes more
            ticket = await limit.acquire()
            clock.now += 0.01
            limit.release(ticket, Answer.HEALTHY)
        assert limit.limit == INITIAL_LIMIT

    asyncio.run(main())


def test_pushback_cuts_it_by_a_quarter_once_per_round_trip() -> None:
    async def main() -> None:
        limit, clock = limited(maximum=16)
        for _ in range(12):
            await full_round(limit, clock, Answer.HEALTHY)
        assert limit.limit == 14
        await full_round(limit, clock, Answer.OVERLOADED)  # 14 answers, sent together
        assert limit.limit == 10 and limit.cuts == 1  # 14 * 0.75
        await full_round(limit, clock, Answer.OVERLOADED)  # sent after the cut: cut again
        assert limit.limit == 7
        for _ in range(6):
            await full_round(limit, clock, Answer.OVERLOADED)
        assert limit.limit == 1 and limit.cuts == 8  # never below one

    asyncio.run(main())


def test_an_answer_far_slower_than_usual_cuts_it_and_a_500_does_not() -> None:
    async def main() -> None:
        limit, clock = limited()
        for _ in range(4):
            await full_round(limit, clock, Answer.HEALTHY, took_s=0.01)
        assert limit.limit == 6
        await full_round(limit, clock, Answer.NEUTRAL)  # a 500: the endpoint's bug
        assert limit.limit == 6
        await full_round(limit, clock, Answer.HEALTHY, took_s=0.1)  # jitter: no signal
        assert limit.limit == 7
        await full_round(limit, clock, Answer.HEALTHY, took_s=4.0)  # a stall
        assert limit.limit == 5 and limit.cuts == 1  # 7 * 0.75

    asyncio.run(main())


def test_a_lasting_slowdown_is_learnt_and_growth_resumes() -> None:
    async def main() -> None:
        limit, clock = limited()
        await full_round(limit, clock, Answer.HEALTHY, took_s=0.01)
        for _ in range(30):  # the endpoint now takes 2 s per answer, for good
            await full_round(limit, clock, Answer.HEALTHY, took_s=2.0)
        assert limit.latency_s == pytest.approx(2.0, rel=0.05)
        assert limit.limit == 8  # grown back to the maximum

    asyncio.run(main())


def test_a_fixed_limit_never_moves() -> None:
    async def main() -> None:
        limit, clock = limited(maximum=8, fixed=3)
        for answer in (Answer.HEALTHY, Answer.OVERLOADED, Answer.HEALTHY):
            await full_round(limit, clock, answer, took_s=5.0)
            assert limit.limit == 3
        assert not limit.adaptive and limit.latency_s == 5.0  # still measured, for /metrics

    asyncio.run(main())
    with pytest.raises(ValueError, match=r"1\.\.4"):
        ConcurrencyLimit(4, fixed=5)


def test_slots_go_in_order_and_a_retry_goes_first() -> None:
    async def main() -> None:
        limit, _ = limited(fixed=1)
        first = await limit.acquire()
        order: list[str] = []

        async def take(name: str, retry: bool) -> Ticket:
            ticket = await limit.acquire(retry=retry)
            order.append(name)
            return ticket

        waiting = [asyncio.create_task(take(name, retry)) for name, retry in
                   (("new-1", False), ("new-2", False), ("retry", True))]
        await asyncio.sleep(0)
        limit.release(first, Answer.HEALTHY)
        for _ in range(3):
            await asyncio.sleep(0)
            done = [task for task in waiting if task.done() and not task.cancelled()]
            for task in done:
                waiting.remove(task)
                limit.release(task.result(), Answer.HEALTHY)
        assert order == ["retry", "new-1", "new-2"] and limit.in_flight == 0

    asyncio.run(main())


def test_a_waiter_cancelled_while_waiting_leaves_no_slot_taken() -> None:
    async def main() -> None:
        limit, _ = limited(fixed=1)
        held = await limit.acquire()
        waiter = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limit.release(held, Answer.HEALTHY)
        assert limit.in_flight == 0
        ticket = await asyncio.wait_for(limit.acquire(), 1)
        assert limit.in_flight == 1
        limit.release(ticket, Answer.HEALTHY)

    asyncio.run(main())


def test_a_batchs_backoff_grows_with_its_failures_and_honours_retry_after() -> None:
    retry = BatchRetry(cap_s=1.0)
    throttled = SinkResult.failure("HTTP 429", "throttled", retry_after_s=3.0)
    failed = SinkResult.failure("HTTP 500", "http_5xx")
    assert retry.delay_after(throttled) >= 3.0  # never sooner than asked, even above the cap
    delays = [retry.delay_after(failed) for _ in range(40)]
    assert all(0 <= d <= 1.0 for d in delays) and retry.failures == 41
    assert retried_here(failed) and retried_here(throttled)
    assert not retried_here(SinkResult.failure("HTTP 401", "http_auth", permanent=True))
    assert not retried_here(SinkResult.failure("disk", "dead_letter"))


def test_the_endpoint_is_down_after_failures_in_a_row_and_one_answer_ends_it() -> None:
    streak = FailureStreak()
    for _ in range(DOWN_AFTER - 1):
        streak.failed()
    assert not streak.down
    streak.failed()
    assert streak.down
    streak.answered()
    assert not streak.down and streak.count == 0


def test_a_waiter_cancelled_as_a_slot_frees_leaves_no_error_and_no_slot_taken() -> None:
    """A second SIGTERM cancels a request waiting for a slot just as another request
    ends: the slot goes to nobody, and the cancel is no ValueError in the log."""
    async def main() -> int:
        limit = ConcurrencyLimit(4, fixed=1)
        first = await limit.acquire()
        waiting = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)  # it waits for the one slot
        waiting.cancel()
        limit.release(first, Answer.HEALTHY)  # frees the slot before the cancel lands
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return limit.in_flight

    assert asyncio.run(main()) == 0
