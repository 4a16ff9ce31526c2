"""A socket frame whose spool write fails is written again, and counted as what it is.

Through the ingestor and a real spool, with the fsync made to fail once (EIO): the
record was written before the fsync failed, so the retry finds it stored. It is this
frame's own write, not a resend: received and acked as stored, not as a duplicate.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

from aggregator.ingest.ingestor import Ingestor
from aggregator.metrics import AgentMetrics
from aggregator.spool import Spool

BODY = (b'{"kind": "task", "name": "w", "state": "FINISHED", "task_id": "a"}\n'
        b'{"kind": "task", "name": "w", "state": "FINISHED", "task_id": "b"}\n')


def test_a_frame_whose_fsync_failed_once_is_stored_once_and_counted_received(
        tmp_path: Path) -> None:
    async def run() -> tuple[int, bool, dict[str, float]]:
        spool = Spool(tmp_path / "spool", max_bytes=64 * 2**20, fsync="always")
        spool.open()
        real_sync = spool._log.sync_through
        failures = [OSError(errno.EIO, "Input/output error")]

        async def sync_failing_once(offset: int) -> None:
            if failures:
                raise failures.pop()
            await real_sync(offset)

        spool._log.sync_through = sync_failing_once  # type: ignore[method-assign]
        metrics = AgentMetrics()
        ingestor = Ingestor(spool, metrics, node_id="n", host="h")
        try:
            result = await ingestor.ingest_frame(
                BODY, ingestor.stamp(os.getpid(), os.getuid()), session=b"s" * 16, seq=1)
            return result.accepted, result.duplicate, metrics.registry.snapshot()
        finally:
            ingestor.close()
            spool.close()

    accepted, duplicate, seen = asyncio.run(run())
    assert (accepted, duplicate) == (2, False)
    assert seen['evagg_received_events_total{route="socket"}'] == 2
    assert seen.get('evagg_duplicate_frames_total{route="socket"}', 0) == 0
    assert seen['evagg_bad_input_total{reason="spool_write_failed",route="socket"}'] == 1
