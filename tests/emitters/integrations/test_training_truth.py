"""The training half tells the truth, as a user meets it: a training script (real CPU torch
under TrainingTracker, the real OpenTelemetry SDK, an `emitters.op` beside it) sends to a
real agent, and the `evagg query sql` command reads the steps and spans views back.

- A step that raised reads FAILED with the exception's type and message, so does the op
  in flight when it raised, and the step counts the failure; ops finished before stay
  FINISHED.
- A step's seconds count each moment of wall time once: the train step spans forward,
  backward and optimizer_step, so the step takes the train step's time, not their sum.
- A step ends when its train step ends (the tracker stamps each op at its start).
- Ops that ran while an OpenTelemetry span was current are spans of its trace: each
  train step a child of `trainer.train`, its forward and backward children of the step;
  `evagg query traces` lists the trace and `evagg query trace ID` draws it as that tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agentproc import REPO, AgentProcess
from tests.commands import evagg_sql

# The user's script. Run "raise-after-forward": steps 0 and 1 train (1 with a NaN loss,
# its update skipped), step 2 raises after forward. Run "raise-in-backward": step 0
# trains, step 1 raises inside loss.backward(). All under the span `trainer.train`.
SCRIPT = r"""
import math, sys
import orjson, torch
import emitters
from emitters import otel
from emitters.torch import TrainingTracker

torch.set_num_threads(1)
otel.init_telemetry("trainer")
tracer = otel.get_tracer("rl")

def loop(run_id, fail_step, where):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        with TrainingTracker(model, optimizer, run_id=run_id) as tracker:
            for i in range(4):
                x = torch.randn(32, 8)
                if i == 1 and where == "after-forward":
                    x[0, 0] = math.nan
                loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
                if i == fail_step and where == "after-forward":
                    raise RuntimeError("reward model timed out")
                if i == fail_step and where == "in-backward":
                    def boom(grad):
                        raise ValueError("gradient hook refused the batch")
                    model[0].weight.register_hook(boom)
                if not torch.isfinite(loss):
                    tracker.metric(loss=loss)
                    tracker.step()
                    continue
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                tracker.metric(loss=loss)
    except (RuntimeError, ValueError) as exc:
        print(f"{run_id}: {type(exc).__name__}: {exc}", file=sys.stderr)

with tracer.start_as_current_span("trainer.train") as span:
    with emitters.op("rollout", run_id="rollout-run") as op:
        op.metric(episodes=4)
    loop("raise-after-forward", 2, "after-forward")
    loop("raise-in-backward", 1, "in-backward")
    ids = span.get_span_context()
assert emitters.flush(30)
assert otel.shutdown_telemetry(timeout_s=30)
print(orjson.dumps({"trace_id": f"{ids.trace_id:032x}", "span_id": f"{ids.span_id:016x}"}).decode())
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The script run once against its own agent; every test here reads its lake."""
    with AgentProcess(tmp_path_factory.mktemp("agent")) as agent:
        yield run_script(agent)


def run_script(agent: AgentProcess) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EVAGG_SOCKET": str(agent.socket_path)}
    env.pop("EVAGG_START_AGENT", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # the loop's exceptions reached the user's code unchanged
    assert "raise-after-forward: RuntimeError: reward model timed out" in done.stderr
    assert "raise-in-backward: ValueError: gradient hook refused the batch" in done.stderr
    ids: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    # 4 + 2 + 2 (after forward) and 4 + 3 (in backward) op events, the rollout's two,
    # the span
    agent.wait_rows("SELECT 1 FROM events WHERE kind IN ('op', 'span')", 18, timeout=120)
    ids["query"] = evagg_sql(agent.lake_dir)
    ids["lake"] = agent.lake_dir
    return ids


def test_a_step_that_raised_reads_failed_and_counts_its_failure(
        trained: dict[str, Any]) -> None:
    query = trained["query"]
    ops = query("SELECT name, state, error_type, error_message FROM ops "
                "WHERE run_id = 'raise-after-forward' AND step = 2 ORDER BY name")
    assert ops == [
        {"name": "forward", "state": "FINISHED", "error_type": None, "error_message": None},
        {"name": "train_step", "state": "FAILED", "error_type": "RuntimeError",
         "error_message": "reward model timed out"}]
    steps = query("SELECT step, failures FROM steps WHERE run_id = 'raise-after-forward' "
                  "ORDER BY step")
    assert steps == [{"step": 0, "failures": 0}, {"step": 1, "failures": 0},
                     {"step": 2, "failures": 1}]
    nan_step = query("SELECT nonfinite FROM ops WHERE run_id = 'raise-after-forward' "
                     "AND step = 1 AND name = 'train_step'")
    assert nan_step == [{"nonfinite": ["loss"]}]


def test_the_op_in_flight_when_the_step_raised_reads_failed(trained: dict[str, Any]) -> None:
    query = trained["query"]
    ops = query("SELECT name, state, error_type, error_message FROM ops "
                "WHERE run_id = 'raise-in-backward' AND step = 1 ORDER BY name")
    assert ops == [
        {"name": "backward", "state": "FAILED", "error_type": "ValueError",
         "error_message": "gradient hook refused the batch"},
        {"name": "forward", "state": "FINISHED", "error_type": None, "error_message": None},
        {"name": "train_step", "state": "FAILED", "error_type": "ValueError",
         "error_message": "gradient hook refused the batch"}]
    assert query("SELECT failures FROM steps WHERE run_id = 'raise-in-backward' "
                 "AND step = 1") == [{"failures": 2}]


def test_step_seconds_count_nested_ops_once(trained: dict[str, Any]) -> None:
    query = trained["query"]
    rows = query(
        "SELECT s.step, s.seconds, o.duration_s AS train_step_s, "
        "       (SELECT sum(duration_s) FROM ops a WHERE a.run_id = s.run_id "
        "        AND a.step = s.step) AS summed "
        "FROM steps s JOIN ops o ON o.run_id = s.run_id AND o.step = s.step "
        "AND o.name = 'train_step' WHERE s.run_id = 'raise-after-forward' ORDER BY s.step")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        # the train step spans its phases: the union of their intervals is the train step
        assert row["seconds"] == pytest.approx(row["train_step_s"], rel=1e-6, abs=1e-6)
        assert row["summed"] > row["seconds"]


def test_a_step_ends_when_its_train_step_ends(trained: dict[str, Any]) -> None:
    # The tracker stamps each op's one event at its start, with its duration: the op's end
    # (`time`), its step's ended_at and its run's are start + duration, not the start.
    query = trained["query"]
    ops = query("SELECT name, epoch_us(started_at) AS started, epoch_us(time) AS ended, "
                "duration_s FROM ops WHERE run_id = 'raise-after-forward'")
    assert len(ops) == 8  # 4 + 2 (a NaN loss: no backward) + 2 (raised after forward)
    for op in ops:
        assert op["ended"] - op["started"] == round(op["duration_s"] * 1e6), op
    steps = query("SELECT s.step, epoch_us(s.ended_at) - epoch_us(s.started_at) AS wall_us, "
                  "s.seconds, epoch_us(s.ended_at) AS ended, epoch_us(o.time) AS step_end "
                  "FROM steps s JOIN ops o ON o.run_id = s.run_id AND o.step = s.step "
                  "AND o.name = 'train_step' WHERE s.run_id = 'raise-after-forward'")
    for step in steps:
        assert step["ended"] == step["step_end"], step
        assert step["wall_us"] >= round(step["seconds"] * 1e6) - 1, step
    (run,) = query("SELECT epoch_us(ended_at) AS ended FROM runs "
                   "WHERE run_id = 'raise-after-forward'")
    assert run["ended"] == max(s["ended"] for s in steps)
    # an op of two events (STARTED, FINISHED) ends when its FINISHED event says
    (rollout,) = query("SELECT epoch_us(o.time) AS ended, (SELECT max(epoch_us(time)) "
                       "FROM events e WHERE e.span_id = o.op_id) AS finished "
                       "FROM ops o WHERE run_id = 'rollout-run'")
    assert rollout["ended"] >= rollout["finished"]


def test_ops_join_the_span_that_ran_them(trained: dict[str, Any]) -> None:
    query = trained["query"]
    trace, parent = trained["trace_id"], trained["span_id"]
    spans = query(f"SELECT name, span_id, parent_span_id, state FROM spans "
                  f"WHERE trace_id = '{trace}' ORDER BY name")
    names = [s["name"] for s in spans]
    assert names.count("trainer.train") == 1
    assert {"rollout", "forward", "backward", "optimizer_step", "train_step"} <= set(names)
    steps = {s["span_id"] for s in spans if s["name"] == "train_step"}
    assert len(steps) == 5  # 3 steps of one run, 2 of the other, each its own span
    for span in spans:
        if span["name"] in ("rollout", "train_step"):
            assert span["parent_span_id"] == parent, span
        elif span["name"] != "trainer.train":  # a step's phase: inside its step
            assert span["parent_span_id"] in steps, span
    # each phase's step holds it: same step number, and the phase within the step's time
    nested = query(f"SELECT count(*) AS n FROM spans p JOIN spans s ON s.trace_id = "
                   f"p.trace_id AND s.span_id = p.parent_span_id WHERE p.trace_id = '{trace}' "
                   "AND s.name = 'train_step' AND p.start_at >= s.start_at")
    assert nested == [{"n": len(spans) - 1 - 1 - len(steps)}]
    # each op a span of its own, and the ops view still pairs the rollout's two events
    assert query("SELECT count(*) AS n FROM ops WHERE run_id = 'rollout-run'") == [{"n": 1}]
    assert query(f"SELECT count(DISTINCT span_id) AS n FROM spans WHERE trace_id = '{trace}' "
                 "AND name = 'forward'") == [{"n": 5}]


def test_the_trace_reads_as_a_tree_from_the_command_line(trained: dict[str, Any]) -> None:
    lake = trained["lake"]
    listed = evagg_query(lake, "traces", "--json")
    (found,) = [t for t in orjson.loads(listed) if t["trace_id"] == trained["trace_id"]]
    assert found["root_name"] == "trainer.train" and found["failures"] == 3
    table = evagg_query(lake, "trace", trained["trace_id"]).splitlines()
    start, end = table[0].index("name"), table[0].index("state")  # the name column
    shown = [line[start:end].rstrip() for line in table[2:-1]]
    assert shown[0] == "trainer.train"
    # each step under the outer span, its phases under the step
    assert "  train_step" in shown and "    forward" in shown and "    backward" in shown
    assert "  rollout" in shown
    assert not any(name.strip() == "forward" and not name.startswith("    ") for name in shown)
    missing = subprocess.run(
        [sys.executable, "-m", "aggregator", "query", "--data", str(lake), "trace", "f" * 32],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert missing.returncode == 1 and f"no spans for trace '{'f' * 32}'" in missing.stderr


def evagg_query(lake: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", "query", "--data", str(lake),
         "--cache", str(lake.parent / "cache"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return done.stdout
