"""A spool capped above its disk, on the disk of a local lake: ingest keeps moving.

The spool used to write until the disk was full; the local Parquet sink then could not
stage the file that delivers the oldest records, so nothing was delivered, no segment
was freed, and producers waited until someone freed the disk by hand. The spool now
leaves part of its disk to the sinks' files.
"""

from __future__ import annotations

from pathlib import Path

from tests.agentproc import AgentProcess
from tests.producers import assert_exactly_once, producer_report, start_producer
from tests.proof.disk import tmpfs

EVENTS = 300_000  # about three times what the disk holds as spool records


def test_a_spool_capped_above_its_disk_leaves_the_lake_room_to_deliver(
        tmp_path: Path) -> None:
    node = tmp_path / "node"
    with tmpfs(node, "24m"):  # the state directory and the lake share it
        agent = AgentProcess(node, agent_toml='max_frame = "1MiB"',
                             spool_toml='max_bytes = "1GiB"\nsegment_bytes = "4MiB"')
        agent.start()
        try:
            producer = start_producer(agent.socket_path, "p", EVENTS, flush_timeout=120)
            report = producer_report(producer, timeout=180)
            assert report["flushed"] and not report["dropped"], report
            assert "which the spool leaves to the sinks' files" in agent.log()
            assert agent.stop() == 0
            assert_exactly_once(agent.lake_dir, {"p": EVENTS})
        finally:
            agent.kill()
