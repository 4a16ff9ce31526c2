"""The shipper the configuration asks for: the `[[files]]` tables and the lake it writes to
(the first Parquet sink's, as Ray's logs: aggregator/raylogs/wiring.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aggregator.artifacts.shipper import ArtifactShipper
from aggregator.config import AgentConfig
from aggregator.ingest.ingestor import Ingestor
from aggregator.metrics import AgentMetrics
from aggregator.raylogs.wiring import lake_store

log = logging.getLogger("evagg.artifacts")
FINAL_S = 10.0  # the last look at the watched directories at a stop, at most


def build_shipper(config: AgentConfig, ingestor: Ingestor,
                  metrics: AgentMetrics) -> ArtifactShipper | None:
    if not config.files:
        return None
    store = lake_store(config, "artifacts")
    if store is None:
        log.warning("the [[files]] directories are not shipped: there is no Parquet sink to "
                    "keep their files in; add a [[sinks]] table of type \"parquet\"")
        return None
    return ArtifactShipper(config.files, store, config.state_dir / "artifacts", ingestor,
                           metrics, node_id=config.node_id, host=config.host)


async def stop_shipper(shipper: ArtifactShipper | None, task: asyncio.Task[None] | None,
                       limit_s: float) -> None:
    """Files finished by the stop are shipped too (before the sinks drain their events)."""
    if shipper is None or task is None:
        return
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(min(FINAL_S, limit_s)):
            await shipper.ship_once()
