"""A multi-process training job on one node, as an ML engineer runs it: torchrun starts two
ranks of DistributedDataParallel over gloo on the CPU, each feeding from a DataLoader with
two forked worker processes and tracking its loop with TrainingTracker, one `emitters.op`
of its own per step; a real agent takes it all, and `evagg query` and the dashboard's
queries read the lake back.

- Every rank's steps are there once each (the forked DataLoader workers neither duplicate
  nor lose any), and each step's events say which rank sent them: `attrs.rank` and
  `attrs.world_size`, the `ops` view's `rank`, the dashboard's ops of a step.
- torchrun's rank reaches every event of the rank's emitter: its own `emitters.op`s and
  its DataLoader workers' events, each item's once.
- backward is the whole of backward under DDP: rank 1 is slow to reach its backward at
  step 2, so rank 0's backward waits there for the gradients' all-reduce, which DDP runs
  in an autograd callback after the graph; that wait is backward's time, not a gap
  between the phases that no op covers.
- A second run stops when rank 1 raises while rank 0 is stuck in a long compute, which
  torchrun then ends with SIGTERM: with the exit handler docs/pytorch.md gives, rank 0's
  step in flight reads FAILED rather than vanish. The Run page (Chromium, 1280 px wide) shows that
  step FAILED with rank 1's error, and its long message wraps rather than push the
  step's other columns off the page.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from dashboard.lake.store import Store, StoreOptions
from dashboard.questions.queries import step_ops
from tests.agentproc import REPO, AgentProcess
from tests.commands import evagg_sql
from tests.dashboard.chromium import ARTIFACTS, chromium, tab
from tests.dashboard.serve import serving

pytest.importorskip("torch")

STEPS = 4
SLOW_STEP = 2
SLOW_S = 2.0
FAIL_STEP = 1
LOADED_MS = 60_000  # a first query over a fresh lake on a loaded 2-core machine is slow

# docs/pytorch.md's line: torchrun ends the other ranks with SIGTERM when one fails
HANDLER = "signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))"

SCRIPT = r"""
import os, signal, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import emitters
from emitters.torch import TrainingTracker

HANDLER
torch.set_num_threads(1)
steps, slow_step, slow_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
run_id, fail_step = sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
class Items(TensorDataset):
    def __getitem__(self, index):  # in a forked DataLoader worker
        emitters.emit(kind="task", name="load_item", state="FINISHED", run_id=run_id,
                      duration_s=0.001, item=int(index))
        return super().__getitem__(index)

data = Items(torch.randn(2 * 8 * steps, 16), torch.randn(2 * 8 * steps, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data), num_workers=2)
with TrainingTracker(model, optimizer, run_id=run_id) as tracker:
    for i, (x, y) in enumerate(tracker.wrap(loader)):
        with emitters.op("prepare", step=tracker.current_step, run_id=run_id):
            x = x * 1.0
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rank == 0 and i == fail_step:
            time.sleep(120)  # stuck (a long compute, a hung collective) till torchrun ends it
        if rank == 1 and i == fail_step:  # as long as the error gloo gives the other rank
            raise RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                               "reward model unreachable: " + "retry budget spent; " * 12)
        if rank == 1 and i == slow_step:
            time.sleep(slow_s)  # a straggler: rank 0 waits for its gradients
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        tracker.metric(loss=loss, tokens=x.shape[0] * 16)
assert emitters.flush(60), emitters.stats()
assert not tracker.errors, tracker.errors
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run "ddp" trains STEPS steps; run "ddp-failed" stops when rank 1 raises at
    FAIL_STEP while rank 0 is stuck there (torchrun then ends rank 0 and exits 1)."""
    workdir = tmp_path_factory.mktemp("ddp")
    script = workdir / "train.py"
    script.write_text(SCRIPT.replace("HANDLER", HANDLER))
    (workdir / "agent").mkdir()
    with AgentProcess(workdir / "agent") as agent:
        env = {**os.environ, "PYTHONPATH": str(REPO), "EVAGG_SOCKET": str(agent.socket_path)}
        env.pop("EVAGG_START_AGENT", None)

        def torchrun(run_id: str, fail_step: int) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node=2", str(script), str(STEPS), str(SLOW_STEP), str(SLOW_S),
                 run_id, str(fail_step)],
                cwd=workdir, env=env, capture_output=True, text=True, timeout=300)

        done = torchrun("ddp", -1)
        assert done.returncode == 0, done.stdout + done.stderr
        failed = torchrun("ddp-failed", FAIL_STEP)
        assert failed.returncode == 1 and "reward model unreachable" in failed.stderr, (
            failed.stdout + failed.stderr)
        # two ranks: per step forward, backward, optimizer_step, train_step and `prepare`
        agent.wait_rows("SELECT 1 FROM events WHERE kind = 'op' AND state <> 'STARTED' "
                        "AND run_id = 'ddp'", 2 * STEPS * 5, timeout=120)
        agent.wait_rows("SELECT 1 FROM events WHERE name = 'load_item' AND run_id = 'ddp'",
                        2 * 8 * STEPS, timeout=120)
        agent.wait_rows("SELECT 1 FROM events WHERE run_id = 'ddp-failed' "
                        "AND name = 'train_step' AND state = 'FAILED'", 2, timeout=120)
        yield {"query": evagg_sql(agent.lake_dir), "lake": agent.lake_dir}


def test_every_rank_sends_each_step_once_and_says_which_rank_it_is(
        trained: dict[str, Any]) -> None:
    rows = trained["query"](
        "SELECT attrs['rank'] AS rank, attrs['world_size'] AS world_size, "
        "list(DISTINCT pid) AS pids, count(*) AS events, "
        "list(step ORDER BY step) AS steps "
        "FROM events_raw WHERE source = 'torch' AND name = 'train_step' AND run_id = 'ddp' "
        "GROUP BY ALL ORDER BY rank")
    assert [(r["rank"], r["world_size"], r["steps"]) for r in rows] == [
        ("0", "2", list(range(STEPS))), ("1", "2", list(range(STEPS)))]
    assert all(len(r["pids"]) == 1 for r in rows)
    assert rows[0]["pids"] != rows[1]["pids"]
    # every event of the tracker's carries its rank, and its rank matches its process
    phases = trained["query"](
        "SELECT name, count(*) AS n, count(DISTINCT (pid, attrs['rank'])) AS ranks "
        "FROM events_raw WHERE source = 'torch' AND attrs['rank'] IS NOT NULL "
        "AND run_id = 'ddp' "
        "GROUP BY name ORDER BY name")
    assert [(r["name"], r["n"], r["ranks"]) for r in phases] == [
        (name, 2 * STEPS, 2) for name in ("backward", "forward", "optimizer_step",
                                          "train_step")]


def test_a_ranks_own_ops_and_its_dataloader_workers_events_carry_its_rank(
        trained: dict[str, Any]) -> None:
    """torchrun's RANK and WORLD_SIZE reach every event of the rank's emitter, and of its
    forked DataLoader workers' (each item loaded once, none lost)."""
    query = trained["query"]
    ranks = {r["pid"]: r["rank"] for r in query(
        "SELECT DISTINCT pid, attrs['rank'] AS rank FROM events "
        "WHERE run_id = 'ddp' AND name = 'train_step'")}
    prepared = query("SELECT pid, rank, count(*) AS n FROM ops WHERE run_id = 'ddp' "
                     "AND name = 'prepare' GROUP BY ALL ORDER BY rank")
    assert [(ranks.get(r["pid"]), r["rank"], r["n"]) for r in prepared] == [
        ("0", "0", STEPS), ("1", "1", STEPS)]
    loaded = query(
        "SELECT attrs['rank'] AS rank, attrs['world_size'] AS world_size, "
        "count(*) AS events, count(DISTINCT attrs['item']) AS items, "
        "count(DISTINCT pid) AS workers, bool_or(list_contains($pids, pid)) AS in_rank "
        "FROM events_raw WHERE run_id = 'ddp' AND name = 'load_item' "
        "GROUP BY ALL ORDER BY rank".replace("$pids", str(sorted(ranks))))
    assert [(r["rank"], r["world_size"], r["events"], r["items"], r["workers"],
             r["in_rank"]) for r in loaded] == [
        (rank, "2", 8 * STEPS, 8 * STEPS, 2, False) for rank in ("0", "1")]


def test_the_ops_view_and_the_dashboard_name_each_ops_rank(trained: dict[str, Any]) -> None:
    rows = trained["query"](
        "SELECT rank, name, count(*) AS n FROM ops WHERE run_id = 'ddp' "
        "AND source = 'torch' GROUP BY ALL ORDER BY ALL")
    assert {(r["rank"], r["n"]) for r in rows} == {("0", STEPS), ("1", STEPS)}
    store = Store(StoreOptions(str(trained["lake"]), refresh_s=0.2))
    try:
        ops = step_ops(store, "ddp").records()
    finally:
        store.close()
    train_steps = [op for op in ops if op["name"] == "train_step"]
    assert sorted((op["step"], op["rank"]) for op in train_steps) == sorted(
        (step, rank) for step in range(STEPS) for rank in ("0", "1"))
    assert len({(op["rank"], op["pid"]) for op in train_steps}) == 2


def test_backward_under_ddp_holds_the_wait_for_the_gradients_all_reduce(
        trained: dict[str, Any]) -> None:
    rows = trained["query"](
        "SELECT attrs['rank'] AS rank, name, duration_s FROM events_raw "
        f"WHERE source = 'torch' AND run_id = 'ddp' AND step = {SLOW_STEP} ORDER BY ALL")
    took = {(r["rank"], r["name"]): r["duration_s"] for r in rows}
    # rank 0 reached backward about SLOW_S before rank 1 did: it spent that long waiting
    # for the all-reduce inside backward (a lower bound only: load makes it longer)
    assert took[("0", "backward")] >= SLOW_S / 4, took
    assert took[("0", "backward")] <= took[("0", "train_step")]


def test_a_rank_that_torchrun_ended_reads_failed_at_its_step_in_flight(
        trained: dict[str, Any]) -> None:
    assert HANDLER in (REPO / "docs" / "pytorch.md").read_text()
    rows = trained["query"](
        "SELECT attrs['rank'] AS rank, step, state, error_type, error_message FROM events "
        "WHERE run_id = 'ddp-failed' AND name = 'train_step' ORDER BY rank, step")
    assert [(r["rank"], r["step"], r["state"]) for r in rows] == [
        (rank, step, "FINISHED" if step < FAIL_STEP else "FAILED")
        for rank in ("0", "1") for step in range(FAIL_STEP + 1)]
    ended = rows[FAIL_STEP]
    assert (ended["error_type"], ended["error_message"]) == ("SystemExit", "143"), ended


def test_the_run_page_names_the_rank_that_failed_and_keeps_its_columns_on_the_page(
        trained: dict[str, Any]) -> None:
    """The failed rank's long error (as long as gloo's) wraps in the ops cell: on one line
    it pushed the failures, wall time and metrics columns past the window's edge."""
    store = Store(StoreOptions(str(trained["lake"]), refresh_s=0.2))
    with serving(store) as url, chromium() as browser, \
            tab(browser, url, width=1280, height=900) as page:
        page.goto("/#/run?run=ddp-failed")
        row = page.locator(f"table.steps tbody tr[data-step='{FAIL_STEP}']")
        failed = row.locator("li", has_text="reward model unreachable")
        expect(failed).to_contain_text("rank 1", timeout=LOADED_MS)
        expect(failed).to_contain_text("FAILED")
        page.screenshot(path=str(ARTIFACTS / "ddp-failed-rank.png"), full_page=True)
        for column in range(2, 6):  # failures, wall time, queue time, metric spread
            box = row.locator("> td").nth(column).bounding_box()
            assert box is not None and box["x"] + box["width"] <= 1280, (column, box)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    store.close()
