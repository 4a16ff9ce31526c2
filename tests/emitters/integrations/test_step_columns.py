"""A training step's events framed straight into columns (StepBuild.columns_of) reach the
agent's spool exactly as the same step's event rows (step_events) do: Hypothesis over
steps with and without each phase, several calls to a phase, failed steps, metrics that
are NaN, infinite or ints, several trackers' steps in one frame, a distributed rank's
attrs on each step's events."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emitters.columns_items import deferred_columns
from emitters.events import DEFERRED, DEFERRED_PLACE
from emitters.integrations.torch_steps import (
    PHASES,
    Step,
    StepBuild,
    step_event_count,
    step_events,
)
from tests.aggregator.decode.framing import CONTEXT, STAMPED, frames, spooled

T0 = 1_796_000_000_000_000_000

METRIC = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5))


@st.composite
def steps(draw: st.DrawFn) -> Step:
    number = draw(st.integers(0, 10**6))
    start = T0 + number * 10_000_000
    done = Step(number, (start, None))
    at = start
    for phase in PHASES:
        calls = draw(st.sampled_from([0, 1, 1, 1, 2]))
        spans = []
        for _ in range(calls):
            length = draw(st.integers(0, 5_000_000))
            spans.append(((at, None), (at + length, None)))
            at += length + 1
        if spans:
            done.phases[phase] = spans
    done.data_wait_s = draw(st.one_of(st.none(), st.floats(0, 1)))  # None: no wrapped loader
    done.metrics = draw(st.dictionaries(st.sampled_from(["loss", "lr", "grad_norm"]),
                                        st.one_of(st.floats(-1e6, 1e6), METRIC), max_size=3))
    done.end = (at, None)
    if draw(st.integers(0, 9)) == 0:
        done.error = {"error_type": "KeyError", "error_message": "'boom'"}
        done.failed = ("backward",) if "backward" in done.phases else ()
    return done


def queued(builds: list[Any], counts: list[int]) -> list[tuple[Any, ...]]:
    """The queue places Emitter.enqueue_deferred makes for these builds."""
    items: list[tuple[Any, ...]] = []
    for build, count in zip(builds, counts, strict=True):
        items.append((0, DEFERRED, (build, count)))
        items += [DEFERRED_PLACE] * (count - 1)
    return items


def as_rows(build: StepBuild) -> Any:
    """The same step without columns_of: the rows path."""
    return lambda: step_events(build.done, build.name, build.ids, build.attrs)


IDS = st.sampled_from([{"run_id": "run-1"}, {"run_id": "run-2", "job_id": "job-9"}])
ATTRS = st.sampled_from([{}, {"rank": "0", "world_size": "2"}, {"rank": "1", "world_size": "2"}])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(steps(), st.sampled_from(["train_step", "eval"]), IDS, ATTRS),
                min_size=1, max_size=6))
def test_a_steps_columns_spool_as_its_rows_do(
        made: list[tuple[Step, str, dict[str, str], dict[str, str]]]) -> None:
    builds = [StepBuild(done, name, ids, attrs) for done, name, ids, attrs in made]
    counts = [step_event_count(done) for done, _, _, _ in made]
    straight, rows = spooled(frames(queued(builds, counts), columns=True))[0], \
        spooled(frames(queued(list(map(as_rows, builds)), counts), columns=True))[0]
    assert straight.num_rows == rows.num_rows == sum(counts)
    for name in rows.schema.names:
        if name not in STAMPED and name != "event_id":
            assert straight.column(name).equals(rows.column(name)), name
    ids = straight.column("event_id").to_pylist()
    assert len(set(ids)) == len(ids) and all(i[14] == "7" for i in ids)


def test_a_plain_cpu_step_takes_the_straight_path_and_an_odd_one_does_not() -> None:
    def plain(number: int) -> Step:
        start = T0 + number
        done = Step(number, (start, None), metrics={"loss": 0.25}, end=(start + 40, None))
        done.phases = {phase: [((start + i * 10, None), (start + i * 10 + 5, None))]
                       for i, phase in enumerate(PHASES)}
        return done

    builds = [StepBuild(plain(n), "train_step", {"run_id": "r"}) for n in range(3)]
    columns = deferred_columns(queued(builds, [4, 4, 4]), CONTEXT)
    assert columns is not None
    assert columns["name"] == [*PHASES, "train_step"] * 3
    assert columns["metrics"][3] == {"loss": 0.25}  # no loader wrapped: no data_wait_s
    assert columns["metrics"][:3] == [None] * 3

    odd = plain(4)
    odd.metrics["loss"] = math.nan  # named in `nonfinite`: the rows path knows how
    assert deferred_columns(queued([*builds, StepBuild(odd, "train_step", {"run_id": "r"})],
                                   [4, 4, 4, 4]), CONTEXT) is None
    assert deferred_columns(queued(builds, [4, 4, 3]), CONTEXT) is None  # another count

    rank = {"rank": "1", "world_size": "2"}  # a distributed job's: on every event, straight
    ranked = [StepBuild(plain(n), "train_step", {"run_id": "r"}, rank) for n in range(2)]
    columns = deferred_columns(queued(ranked, [4, 4]), CONTEXT)
    assert columns is not None and len(columns["attrs"]) == 8
    assert all(attrs.items() >= rank.items() for attrs in columns["attrs"])
    # steps of two ranks in one frame (two trackers in one process) take the rows path
    other = StepBuild(plain(2), "train_step", {"run_id": "r"}, {"rank": "0", "world_size": "2"})
    assert deferred_columns(queued([*ranked, other], [4, 4, 4]), CONTEXT) is None
