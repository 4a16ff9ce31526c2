"""`evagg compact`: merge each partition's small Parquet files, as the agent's hour merge
does, in a lake named on the command line or read off the agent's config.

The lake is chosen as `evagg query` chooses it (lake_choice.py). Where it comes from the
config, the Parquet sink's S3 options come with it (endpoint, region, addressing,
encryption, storage class), so that a merge run by hand writes what the agent's own
would; a flag given wins, and the three upload flags go together (one given, none is
taken from the config). A target together with an explicit `--config` is refused: which
of the two names the lake, and whose upload options apply, would be a guess.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from aggregator.cli.arguments import Parsers
from dashboard.cli.lake_flags import add_config_flag
from sinks.locations import is_s3_url

if TYPE_CHECKING:
    from sinks.parquet.options import S3Options


def add_compact_parser(commands: Parsers) -> None:
    compact = commands.add_parser(
        "compact", help="merge a partition's small Parquet files",
        description="Merge each date=/hour=/node= partition's Parquet files into one file "
                    "(one row per event_id) and write its task fragment under _tasks/, as "
                    "the agent's hour merge does; build the fragment of a merged file that "
                    "lacks one.")
    compact.add_argument("target", nargs="?",
                         help="local directory or s3://bucket/prefix/ (default: --data, else "
                              "the lake of --config, else $EVAGG_DATA, else the lake of "
                              "$EVAGG_CONFIG, else the user's data directory, as `evagg "
                              "query`)")
    compact.add_argument("--data", help="the lake, as the positional target")
    add_config_flag(compact)
    compact.add_argument("--partition", help="only this partition, e.g. date=2026-11-29/hour=13")
    compact.add_argument("--min-files", type=_at_least_two, default=2,
                         help="merge a partition only when it has at least this many files "
                              "older than --grace (default 2; a partition of one file is "
                              "left as it is)")
    compact.add_argument("--endpoint-url", help="S3-compatible endpoint (default: the "
                                                "config's, else AWS)")
    compact.add_argument("--region", help="S3 region (default: the config's, else boto3's)")
    compact.add_argument("--grace", type=float, default=600.0,
                         help="leave files younger than this many seconds alone (default "
                              "%(default)g: the agent may still be merging their hour)")
    compact.add_argument("--sse", help="S3 server-side encryption of merged files: AES256, "
                         "aws:kms or aws:kms:dsse (as the sink's `sse`; default: the "
                         "config's)")
    compact.add_argument("--sse-kms-key-id", help="the KMS key for --sse aws:kms")
    compact.add_argument("--storage-class", help="S3 storage class of merged files, e.g. "
                         "STANDARD_IA (as the sink's `storage_class`; default: the config's)")
    compact.add_argument(
        "--rewrite-types", action="store_true",
        help="also rewrite every partition that still has files written before evagg wrote "
             "times in microseconds (nanosecond time/received, which Spark 4 and pyiceberg "
             "refuse and Trino's and Athena's Hive tables cut to milliseconds), even one "
             "of a single file; times are cut down to the microsecond, which every evagg "
             "view already works in. Run it once over an older lake; with --dry-run it "
             "lists the partitions it would rewrite")
    compact.add_argument("--dry-run", action="store_true",
                         help="print what would be merged and deleted, and change "
                              "nothing")
    compact.set_defaults(command=run_compact_command)


def _at_least_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 2:
        raise argparse.ArgumentTypeError("at least 2: merging one file changes nothing")
    return value


def run_compact_command(args: argparse.Namespace) -> int:
    from sinks.parquet.compact import run_compact
    from sinks.parquet.stores import StoreError

    refused = _lake_named_twice(args)
    if refused:
        print(f"evagg compact: {refused}", file=sys.stderr)
        return 2
    try:
        target, configured = _chosen_lake(args)
        uploads = _upload_args(args, configured)
    except ValueError as exc:
        print(f"evagg compact: {exc}", file=sys.stderr)
        return 2
    if uploads and not is_s3_url(target):
        print("evagg compact: --sse, --sse-kms-key-id and --storage-class apply to s3:// "
              "targets only", file=sys.stderr)
        return 2
    try:
        report = run_compact(target, partition=args.partition, min_files=args.min_files,
                             endpoint_url=args.endpoint_url, region=args.region,
                             path_style=configured.path_style if configured else None,
                             dry_run=args.dry_run, grace_s=args.grace, upload_args=uploads,
                             rewrite_types=args.rewrite_types)
    except (ValueError, OSError, StoreError) as exc:
        print(f"evagg compact: {exc}", file=sys.stderr)
        return 1
    print(report)
    return 1 if report.errors else 0


def _lake_named_twice(args: argparse.Namespace) -> str | None:
    if args.target and args.data and args.target != args.data:
        return "give the lake once, as the target or as --data"
    return None


def _chosen_lake(args: argparse.Namespace) -> tuple[str, S3Options | None]:
    """The lake to merge, and the S3 options of the agent's sink when it came from its
    config (None otherwise); raises ValueError saying what to give instead."""
    from aggregator.cli.lake_choice import apply_config_lake
    from aggregator.config import ConfigError
    from dashboard.cli.query import default_data
    from sinks.parquet.options import S3Options

    named = args.target or args.data
    args.data = named
    try:
        lake = apply_config_lake(args)  # sets args.endpoint_url and args.region where unset
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if named and args.config is not None and lake is None:
        # which of the two to merge, and whether the config's encryption applies, a guess
        raise ValueError("give the lake once: --config names its Parquet sink's lake and "
                         "upload options; a target (or --data) names a lake with the flags' "
                         "options only, or one of the config's Parquet sinks")
    if lake is None or not is_s3_url(lake.url):
        return args.data or default_data(), None
    try:
        return lake.url, S3Options.from_table(lake.options)
    except ValueError as exc:  # as `evagg check-config` would say; the agent refuses it too
        raise ValueError(f"sink {lake.name}: {exc}") from None


def _upload_args(args: argparse.Namespace, configured: S3Options | None) -> dict[str, str]:
    """The flags' upload arguments where any upload flag is given, else the config's."""
    from sinks.parquet.options import UPLOAD_KEYS
    from sinks.parquet.s3_uploads import upload_args

    if not any(getattr(args, key) for key in UPLOAD_KEYS):  # each flag named as its option
        return dict(configured.upload_args) if configured else {}
    try:
        return upload_args(args.sse, args.sse_kms_key_id, args.storage_class)
    except ValueError as exc:  # name the flag, not the sink's option
        option, _, reason = str(exc).partition(": ")
        raise ValueError(f"--{option.replace('_', '-')}: {reason}") from None
