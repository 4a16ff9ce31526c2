"""The follower the configuration asks for: `[ray] log_dir` and the lake it writes to.

The pieces go to the first Parquet sink's lake (a local directory or s3:// prefix),
through a store object of the same kind that sink uses; with collection off
(`log_dir = ""`) or no Parquet sink there is no follower.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aggregator.config import AgentConfig
from aggregator.losses import LossRecorder
from aggregator.metrics import AgentMetrics
from aggregator.raylogs.follower import RayLogFollower
from sinks.locations import is_s3_url
from sinks.parquet.options import ParquetOptions
from sinks.parquet.stores import LocalStore, ObjectStore

log = logging.getLogger("evagg.raylogs")


def build_follower(config: AgentConfig, metrics: AgentMetrics,
                   losses: LossRecorder) -> RayLogFollower | None:
    if not config.ray_log_dir:
        return None
    store = lake_store(config, "ray-logs")
    if store is None:
        log.info("Ray log files are not collected: no Parquet sink to keep them in")
        return None
    return RayLogFollower(Path(config.ray_log_dir).expanduser(), store,
                          config.state_dir / "ray-logs", metrics, losses)


def lake_store(config: AgentConfig, staging: str) -> ObjectStore | None:
    """A store of the first Parquet sink's lake, of the kind that sink uses; on S3 its
    staging files go under `<state_dir>/staging/<staging>`. None without a Parquet sink."""
    lake = next((sink for sink in config.sinks if sink.type == "parquet"), None)
    if lake is None:
        return None
    if is_s3_url(lake.url):
        from sinks.parquet.s3 import S3Store  # boto3 loads only for a lake on S3

        options = ParquetOptions.from_table(lake.options, lake.url)
        return S3Store(lake.url, options.s3, staging_dir=config.state_dir / "staging" / staging)
    return LocalStore(Path(lake.url).expanduser())
