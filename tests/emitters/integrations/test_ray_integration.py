"""emitters.ray and emitters.tracecontext.

Without Ray: traceparent format and parsing, inject/attach, nesting across threads and
asyncio tasks, OpenTelemetry spans as parents, the signature `traced_remote` gives Ray.
With a real local Ray cluster and a real agent: ops inside remote functions and actor
methods carry Ray's task, job, node, worker and actor ids, and a driver op and the ops
two levels of remote calls below it share one trace with the right parents.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import emitters
from emitters import tracecontext
from emitters.ray import TRACE_KWARG, ray_ids, ray_op, trace_kwargs, traced_remote
from emitters.tracecontext import (
    TraceContext,
    attach_trace_context,
    format_traceparent,
    inject_trace_context,
    parse_traceparent,
    span,
)
from tests.agentproc import REPO, AgentProcess
from tests.rayexport import lake_query
from tests.raylocal import local_ray
from tests.waiting import wait_for

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


# ---- trace context, no Ray ---------------------------------------------------------------


def test_traceparent_round_trip() -> None:
    header = f"00-{TRACE}-{SPAN}-01"
    context = parse_traceparent(header, "vendor=1")
    assert context == TraceContext(TRACE, SPAN, None, True, "vendor=1")
    assert format_traceparent(context) == header
    unsampled = parse_traceparent(f"00-{TRACE}-{SPAN}-00")
    assert unsampled is not None and format_traceparent(unsampled).endswith("-00")
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-01-future") is not None  # later versions


@pytest.mark.parametrize("header", [
    None, 7, "", "00-abc-def-01", f"ff-{TRACE}-{SPAN}-01", f"00-{'0' * 32}-{SPAN}-01",
    f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE}-{SPAN}-01-extra", f"00-{TRACE}-{SPAN}",
    f"00-{TRACE}x-{SPAN}-01",
])
def test_invalid_traceparent_is_ignored(header: Any) -> None:
    assert parse_traceparent(header) is None
    with attach_trace_context({"traceparent": header}) as attached:
        assert attached.context is None and tracecontext.current() is None


def test_inject_without_a_span_leaves_meta_alone() -> None:
    meta = {"other": "kept"}
    assert inject_trace_context(meta) is meta and meta == {"other": "kept"}
    with attach_trace_context("not a dict") as attached:
        assert attached.context is None


def test_inject_attach_and_nesting() -> None:
    with span() as root:
        assert root.context is not None and root.context.parent_span_id is None
        meta = inject_trace_context({})
        assert meta == {"traceparent": f"00-{root.context.trace_id}-{root.context.span_id}-01"}
    assert tracecontext.current() is None
    with attach_trace_context(meta), span() as child, span() as grandchild:
        assert child.context is not None and grandchild.context is not None
        assert child.context.trace_id == root.context.trace_id
        assert child.context.parent_span_id == root.context.span_id
        assert grandchild.context.parent_span_id == child.context.span_id
        assert tracecontext.current() == grandchild.context
    assert tracecontext.current() is None


def test_context_is_per_thread_and_per_asyncio_task() -> None:
    seen: dict[str, TraceContext | None] = {}

    def other_thread() -> None:
        seen["thread"] = tracecontext.current()

    async def task(name: str, meta: dict[str, str]) -> None:
        with attach_trace_context(meta):
            await asyncio.sleep(0.01)
            seen[name] = tracecontext.current()

    async def both() -> None:
        await asyncio.gather(task("a", {"traceparent": f"00-{TRACE}-{SPAN}-01"}),
                             task("b", {"traceparent": f"00-{TRACE[::-1]}-{SPAN[::-1]}-01"}))

    with span():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    asyncio.run(both())
    assert seen["thread"] is None
    assert seen["a"] is not None and seen["a"].span_id == SPAN
    assert seen["b"] is not None and seen["b"].span_id == SPAN[::-1]


def test_an_open_telemetry_span_is_the_parent() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("otel-step") as otel_span:
        expected = otel_span.get_span_context()
        meta = inject_trace_context({})
        with span() as child:
            assert child.context is not None
            assert child.context.trace_id == f"{expected.trace_id:032x}"
            assert child.context.parent_span_id == f"{expected.span_id:016x}"
    assert meta["traceparent"] == f"00-{expected.trace_id:032x}-{expected.span_id:016x}-01"


def test_traced_remote_adds_a_keyword_only_trace_parameter() -> None:
    @traced_remote
    def plain(a: int, b: int = 2) -> int:
        return a + b

    @traced_remote(name="custom")
    def with_kwargs(a: int, **rest: Any) -> int:
        return a

    @traced_remote
    async def coroutine(a: int) -> int:
        return a

    assert list(inspect.signature(plain).parameters) == ["a", "b", TRACE_KWARG]
    params = list(inspect.signature(with_kwargs).parameters)
    assert params == ["a", TRACE_KWARG, "rest"]
    assert inspect.signature(plain).parameters[TRACE_KWARG].kind is inspect.Parameter.KEYWORD_ONLY
    assert plain(1, evagg_trace={"traceparent": f"00-{TRACE}-{SPAN}-01"}) == 3
    assert asyncio.run(coroutine(5)) == 5
    assert trace_kwargs() == {TRACE_KWARG: {}}  # no span open: nothing to carry
    assert with_kwargs.__name__ == "with_kwargs" and with_kwargs(4, extra=1) == 4


def test_detach_in_another_context_is_harmless() -> None:
    attached = attach_trace_context({"traceparent": f"00-{TRACE}-{SPAN}-01"})
    contextvars.copy_context().run(attached.detach)  # the token belongs to this context
    assert tracecontext.current() is None or tracecontext.current().span_id == SPAN
    attached.detach()
    assert tracecontext.current() is None


def test_failures_inside_the_integration_never_reach_the_caller(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import ray

    import emitters
    from emitters.integrations import ray as ray_integration  # its private counters

    if not ray.is_initialized():  # this module's cluster may be up: tests run in any order
        assert ray_ids() == {}

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(ray, "is_initialized", broken)
    monkeypatch.setattr(emitters, "emit", broken)
    before = dict(ray_integration._failures)
    with caplog.at_level(logging.WARNING, logger="evagg.ray"), ray_op("survives") as op:
        op.metric(x=1.0)
        op.set(extra="kept")
        assert op.context is not None and tracecontext.current() == op.context
    assert ray_ids() == {}
    assert ray_integration._failures["emit"] == before["emit"] + 2
    assert ray_integration._failures["ray_ids"] == before["ray_ids"] + 2
    assert tracecontext.current() is None


# ---- real Ray, real agent --------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    env = {"EVAGG_SOCKET": str(process.socket_path), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    # the driver's ops go through this process's default emitter, which another test
    # module may have pointed elsewhere
    emitters.configure(socket=str(process.socket_path))
    try:
        with local_ray(env, dashboard=False):
            yield process
    finally:
        process.stop()


def remote_workload() -> dict[str, Any]:
    import ray

    @ray.remote
    @traced_remote
    def leaf(x: int) -> dict[str, Any]:
        with ray_op("leaf_inner", step=x):
            pass
        return ray_ids()

    @ray.remote
    @traced_remote
    def middle(x: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return ray.get(leaf.remote(x, **trace_kwargs())), ray_ids()

    @ray.remote
    @traced_remote
    def broken() -> None:
        raise ValueError("broken op")

    @ray.remote
    class Accumulator:
        @traced_remote
        def add(self, x: int) -> dict[str, Any]:
            return ray_ids()

    with ray_op("driver_step", step=1) as step:
        leaf_ids, middle_ids = ray.get(middle.remote(1, **trace_kwargs()))
        accumulator = Accumulator.remote()  # type: ignore[attr-defined]
        actor_ids = ray.get(accumulator.add.remote(2, **trace_kwargs()))
        with pytest.raises(ray.exceptions.RayTaskError, match="broken op"):
            ray.get(broken.remote(**trace_kwargs()))
        step.metric(loss=0.5)
    return {"leaf": leaf_ids, "middle": middle_ids, "actor": actor_ids, "driver": ray_ids()}


def test_ops_in_ray_carry_ray_ids_and_one_trace(agent: AgentProcess) -> None:
    ids = remote_workload()
    names = ("driver_step", "middle", "leaf", "leaf_inner", "Accumulator.add", "broken")

    def ops() -> dict[tuple[str, str], dict[str, Any]] | None:
        rows = lake_query(agent, "SELECT * FROM events WHERE kind = 'op'")
        found = {(r["name"], r["state"]): r for r in rows}
        terminal = all((n, "FINISHED") in found or (n, "FAILED") in found for n in names)
        return found if terminal and all((n, "STARTED") in found for n in names) else None

    found = wait_for(ops, 40, "op events from the Ray workers", interval=0.5)
    for name, key in (("middle", "middle"), ("leaf", "leaf"), ("Accumulator.add", "actor")):
        started, finished = found[(name, "STARTED")], found[(name, "FINISHED")]
        expected = ids[key]
        for column in ("task_id", "job_id", "node_id", "worker_id", "attempt"):
            assert started[column] == finished[column] == expected[column], (name, column)
        assert started["span_id"] == finished["span_id"] and finished["duration_s"] >= 0
    assert found[("Accumulator.add", "FINISHED")]["actor_id"] == ids["actor"]["actor_id"]
    assert found[("middle", "FINISHED")]["actor_id"] is None
    assert len(ids["leaf"]["task_id"]) == 48 and ids["leaf"]["task_id"] != ids["middle"]["task_id"]
    driver = found[("driver_step", "FINISHED")]
    assert driver["task_id"] is None and driver["job_id"] == ids["driver"]["job_id"]
    assert driver["step"] == 1 and driver["metrics"] == [("loss", 0.5)]

    chain = ["driver_step", "middle", "leaf", "leaf_inner"]
    spans = [found[(n, "FINISHED")] for n in chain]
    assert len({s["trace_id"] for s in spans}) == 1 and len(spans[0]["trace_id"]) == 32
    assert spans[0]["parent_span_id"] is None
    for parent, child in itertools.pairwise(spans):
        assert child["parent_span_id"] == parent["span_id"], child["name"]
    assert found[("Accumulator.add", "STARTED")]["parent_span_id"] == spans[0]["span_id"]

    failed = found[("broken", "FAILED")]
    assert (failed["error_type"], failed["error_message"]) == ("ValueError", "broken op")
    assert "raise ValueError" in failed["stack_trace"]
    assert failed["parent_span_id"] == spans[0]["span_id"]


def test_ray_ids_in_the_driver(agent: AgentProcess, tmp_path: Path) -> None:
    import ray

    ids = ray_ids()
    assert ids["job_id"] == ray.get_runtime_context().get_job_id()
    assert ids["node_id"] == ray.get_runtime_context().get_node_id()
    assert "task_id" not in ids and "actor_id" not in ids


RAY_JOB = textwrap.dedent("""
    import ray
    from emitters.ray import traced_remote
    from tests.raylocal import local_ray

    @ray.remote
    @traced_remote
    def work() -> str:
        return ray.get_runtime_context().get_task_function_name()

    with local_ray({}, dashboard=False, num_cpus=1):
        print("ray names it", ray.get(work.remote()))
""")


def test_a_traced_function_of_a_script_keeps_the_name_ray_gives_it(tmp_path: Path) -> None:
    """Ray names a script's function after the script's file (ray_job.work): the
    wrapper's own file (emitters/integrations/ray.py) must not rename it ray.work."""
    script = tmp_path / "ray_job.py"
    script.write_text(RAY_JOB)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ray names it ray_job.work" in done.stdout.splitlines()
