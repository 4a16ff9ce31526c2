"""The spool's disk fills before the spool's cap: what an on-call sees.

The spool's own numbers (its bytes of a 1 GiB cap) look healthy while every append fails,
so /readyz, /metrics and `evagg status` must say that the disk is the trouble, and stop
saying so once space returns and an append succeeds. A sink that delivered but whose
cursor finds no room has not failed.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import AgentProcess
from tests.commands import check_config, evagg
from tests.proof import metric_where, wait_until
from tests.proof.disk import (
    agent_capped_above_its_disk,
    filesystem_full,
    fill,
    post_events,
    tmpfs,
)
from tests.sinks.server_thread import ServerThread

FAILING = "evagg_spool_write_failing_since_timestamp_seconds"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs under the agent's state dir, almost all of it taken by another file."""
    workdir = tmp_path / "agent"
    state = workdir / "state"
    with tmpfs(state, "16m"):
        yield workdir


def readyz(agent: AgentProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{agent.http_url}/readyz", timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def status_text(agent: AgentProcess) -> str:
    done = evagg("status", "--url", agent.http_url, "--interval", "0.2")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_full_disk_is_named_by_readyz_metrics_and_status(small_disk: Path) -> None:
    receiver = ServerThread().start()
    receiver.stop()  # the sink is down, so nothing the spool holds is freed
    agent = agent_capped_above_its_disk(small_disk, receiver, 'retry_max_backoff = "2s"\n')
    filler = small_disk / "state" / "other-use"
    try:
        assert readyz(agent)[0] == 200
        fill(filler, leave=2 * 2**20)
        body = b'{"kind": "op", "name": "while-full", "pad": "' + b"x" * 300 + b'"}\n'
        wait_until(lambda: post_events(agent, body * 2000)[0] == 503
                   and filesystem_full(small_disk / "state"), 60, "the disk to fill")
        code, words = readyz(agent)
        # the spool stops short of the disk's end, leaving the rest to the sinks' files
        assert code == 503 and "(ENOSPC)" in words, (code, words)
        assert "less than 1MiB free, which the spool leaves to the sinks' files" in words, words
        assert metric_where(agent, FAILING, reason="ENOSPC") > 0
        status = status_text(agent)
        assert "cannot write (ENOSPC) since" in status and "free space" in status, status
        filler.unlink()  # space returns: once appends succeed and none fails, words go
        assert post_events(agent, body)[0] == 200
        wait_until(lambda: readyz(agent)[0] == 200, 60, "/readyz to say ready again")
        assert metric_where(agent, FAILING) == 0  # the name stays, with no sample
        assert "cannot write" not in status_text(agent)
    finally:
        agent.kill()
        receiver.close()


def test_a_cursor_the_full_disk_cannot_take_does_not_fail_the_sink(small_disk: Path) -> None:
    """The spool filled the disk itself (one segment, everything in it): the sink delivers
    it all, but its cursor file finds no room, and a second sink still down holds every
    record. That is no failed delivery: the sink stays `ok` and its cursor waits in memory
    for room."""
    receiver, down = ServerThread().start(), ServerThread().start()
    receiver.answer_always(503)
    down.answer_always(503)
    sinks = (f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{receiver.url}"\n'
             'retry_max_backoff = "1s"\n'
             f'[[sinks]]\nname = "down"\ntype = "http"\nurl = "{down.url}"\n'
             'retry_max_backoff = "1s"\n')
    # no heartbeat after the start's: the sink's lag must stay at 0 once it is there
    agent = AgentProcess(small_disk, sinks_toml=sinks, spool_toml='max_bytes = "1GiB"',
                         heartbeat_interval="1h")
    agent.start()
    filler = small_disk / "state" / "other-use"
    try:
        fill(filler, leave=3 * 2**20)
        body = b'{"kind": "op", "name": "while-full", "pad": "' + b"x" * 300 + b'"}\n'
        wait_until(lambda: post_events(agent, body * 500)[0] == 503
                   and filesystem_full(small_disk / "state"), 60, "the disk to fill")
        fill(small_disk / "state" / "the-last-pages", leave=0)  # no cursor file fits
        receiver.answer_always(200)
        wait_until(lambda: metric_where(agent, "evagg_sink_lag_events", sink="collector") == 0,
                   60, lambda: f"the sink to deliver:\n{agent.log()[-3000:]}")
        line = next(line for line in status_text(agent).splitlines()
                    if line.startswith("sink collector"))
        # ok; the 503s it met before are still counted as recent ones, for five minutes
        assert re.search(r"  ok(, but \d+ of its \d+ requests in the last 5 min failed "
                         r"\(http_5xx \d+\) and were retried)?$", line), line
        assert metric_where(agent, "evagg_worker_errors_total", worker="sink:collector") == 0
        assert "is kept in memory until the disk has room" in agent.log()
    finally:
        agent.kill()
        receiver.close()
        down.close()


def test_a_disk_smaller_than_one_segment_frees_what_was_delivered(small_disk: Path) -> None:
    """The spool's 64 MiB segment never fills on a 16 MiB disk: the disk fills first with
    one segment that the sink has delivered whole. Ingest must come back by itself, with
    nothing the agent answered 200 for lost, rather than refuse every event until someone
    restarts it."""
    receiver = ServerThread().start()
    agent = agent_capped_above_its_disk(small_disk, receiver,
                                        'batch_interval = "100ms"\nretry_max_backoff = "1s"\n')
    accepted = 0
    line = b'{"kind": "op", "name": "fills-the-disk", "pad": "' + b"x" * 300 + b'"}\n'

    def post(count: int) -> int:
        nonlocal accepted
        code = post_events(agent, line * count)[0]
        accepted += count if code == 200 else 0
        return code

    try:
        wait_until(lambda: post(500) == 503 and filesystem_full(small_disk / "state"), 60,
                   lambda: f"the disk to fill:\n{agent.log()[-3000:]}")
        wait_until(lambda: post(500) == 200, 60,
                   lambda: f"ingest to come back once all was delivered:\n"
                           f"{agent.log()[-3000:]}\n{agent.metrics()}")
        wait_until(lambda: readyz(agent)[0] == 200, 60, "/readyz to say ready again")
        wait_until(lambda: len([e for e in receiver.accepted_events()
                                if e.get("name") == "fills-the-disk"]) >= accepted, 60,
                   "every accepted event to arrive")
        delivered = {str(e["event_id"]) for e in receiver.accepted_events()
                     if e.get("name") == "fills-the-disk"}
        assert len(delivered) == accepted, (len(delivered), accepted)
        assert metric_where(agent, "evagg_spool_totals", total="segments_deleted") > 0
        assert "so the spool deleted the segment it was writing too" in agent.log()
    finally:
        agent.kill()
        receiver.close()


def test_a_spool_cap_larger_than_its_disk_is_a_warning(small_disk: Path) -> None:
    """The default cap (4GiB) on a 16 MiB disk: check-config and the agent's start say it
    before the disk fills, with the number to set."""
    agent = AgentProcess(small_disk, spool_toml='max_bytes = "4GiB"')
    done = check_config("--config", str(agent.config_path), "--offline")
    said = "spool.max_bytes: 4GiB is more than the whole filesystem of agent.state_dir"
    assert done.returncode == 0 and said in done.stderr, done.stderr
    assert "set spool.max_bytes to at most 12MiB" in done.stderr, done.stderr
    agent.start()
    try:
        assert said in agent.log()
    finally:
        agent.stop()
