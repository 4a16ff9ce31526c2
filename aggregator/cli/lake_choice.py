"""Which lake `evagg query`, `evagg dashboard`, `evagg export-traces` and `evagg compact`
take when no `--data` names one: the one the agent writes, read off its config.

On a node the agent runs from /etc/evagg/evagg.toml and writes to its Parquet sink's url
(often `s3://...`); `evagg query` without `--data` would read the user's data directory
instead, and answer about nothing. So the commands take the agent's `--config` (else
`$EVAGG_CONFIG`) as `evagg status` and `evagg emit` do. The order, explicit before
ambient: `--data`, `--config`, `$EVAGG_DATA`, `$EVAGG_CONFIG`, the user's data directory.
The sink's `endpoint_url` and `region` come along unless their flags are given (`evagg
compact` takes the rest of its S3 options too: aggregator/cli/compact.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggregator.config.sinks import SinkConfig


class LakeChoiceError(ValueError):
    """The config names no one lake: the message says what to give instead."""


def apply_config_lake(args: argparse.Namespace) -> SinkConfig | None:
    """Fill args.data (and endpoint_url, region where unset) from the agent's config when
    the command line names no lake, and return the Parquet sink it came from (None when
    the lake is not the config's); raises LakeChoiceError (or ConfigError) when the config
    names no one lake. A `--data` that names one of `--config`'s Parquet sinks (what the
    refusal of a config with several asks for) takes that sink's options the same way."""
    if getattr(args, "data", None):
        return _named_sink(args)
    path: Path | None = getattr(args, "config", None)
    if path is None:
        if os.environ.get("EVAGG_DATA") or not os.environ.get("EVAGG_CONFIG"):
            return None
        path = Path(os.environ["EVAGG_CONFIG"])
    from aggregator.config import configured_lakes

    lakes = configured_lakes(path)
    if not lakes:
        raise LakeChoiceError(f"{path} has no Parquet sink, so its agent writes no lake "
                              "here: give --data DIR or s3://bucket/prefix")
    if len(lakes) > 1:
        urls = ", ".join(f"{sink.name}: {sink.url}" for sink in lakes)
        raise LakeChoiceError(f"{path} has {len(lakes)} Parquet sinks ({urls}): give "
                              "--data with the one to read")
    args.data = lakes[0].url
    return _take_options(args, lakes[0])


def _named_sink(args: argparse.Namespace) -> SinkConfig | None:
    """The Parquet sink of an explicit `--config` whose url `--data` names, its options
    taken where unset; None when there is no such config or sink."""
    path: Path | None = getattr(args, "config", None)
    if path is None:
        return None
    from aggregator.config import configured_lakes

    wanted = _same_lake(str(args.data))
    for lake in configured_lakes(path):
        if _same_lake(lake.url) == wanted:
            return _take_options(args, lake)
    return None


def _same_lake(url: str) -> str:
    """A lake's url as compared: `s3://b/p/` and `s3://b/p` are one, a directory by its
    absolute path."""
    if url.startswith("s3://"):
        return url.rstrip("/")
    return str(Path(url).expanduser().resolve())


def _take_options(args: argparse.Namespace, lake: SinkConfig) -> SinkConfig:
    for option in ("endpoint_url", "region"):
        value = lake.options.get(option)
        if isinstance(value, str) and value and not getattr(args, option, None):
            setattr(args, option, value)
    return lake
