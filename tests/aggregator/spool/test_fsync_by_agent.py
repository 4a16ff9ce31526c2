"""`[spool] fsync` through a real agent (docs/spool.md, "fsync"): with "always" an ack
means an fsync covered the frame, and the agent says so on /metrics; with "os" the
active segment is left to the page cache. Either way a kill -9 right after the ack
loses nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.agentproc import DEFAULT_SPOOL, AgentProcess
from tests.producers import assert_exactly_once, producer_report, start_producer

FSYNCS = 'evagg_spool_totals{total="fsyncs"}'


@pytest.mark.parametrize("fsync", ["always", "os"])
def test_acked_frames_survive_a_kill_and_always_means_an_fsync_per_ack(
        agent_factory: Callable[..., AgentProcess], fsync: str) -> None:
    agent = agent_factory(spool_toml=f'{DEFAULT_SPOOL}\nfsync = "{fsync}"').start()
    for batch in range(3):  # three producers one after another: three acked flushes
        report = producer_report(start_producer(agent.socket_path, f"{fsync}{batch}", 400))
        assert report["flushed"] and report["raised"] == 0
    fsyncs = agent.metric(FSYNCS)
    if fsync == "always":
        assert fsyncs >= 3, agent.metrics()  # appends share fsyncs, but each flush waited
    else:
        assert fsyncs == 0, agent.metrics()  # one segment, never rolled: never fsynced
    agent.kill()  # before the lake has all of it: the spool must hand it on
    agent.start()
    agent.wait_delivered(1)
    assert agent.stop() == 0
    assert_exactly_once(agent.lake_dir, {f"{fsync}{batch}": 400 for batch in range(3)})
