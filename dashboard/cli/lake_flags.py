"""The `--config` flag of the commands that read a lake (`evagg query`, `evagg
dashboard`, `evagg export-traces`), kept light: `evagg export-traces`'s parser is built
at every `evagg` start, before DuckDB may be loaded. The command line
(aggregator/cli/lake_choice.py) reads the lake off the config the flag names."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config_flag(parser: argparse.ArgumentParser, default: object = None) -> None:
    parser.add_argument("--config", type=Path, default=default,
                        help="the agent's TOML file: read the lake its Parquet sink writes "
                             "(default: $EVAGG_CONFIG, where --data and $EVAGG_DATA are "
                             "unset)")
