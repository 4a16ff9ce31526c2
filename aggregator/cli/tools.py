"""Offline tools: `evagg query`, `dashboard`, `compact`, `export-traces`, and `dlq`'s
parser (its front door is aggregator/cli/dlq.py).

Each imports its implementation only when run, so `evagg run` starts without DuckDB's
query layer, boto3 or the OpenTelemetry protobufs loaded.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from aggregator.cli.arguments import (
    EvaggParser,
    Parsers,
    parse_naming_the_command,
    subcommands,
)
from aggregator.cli.dlq import add_dlq_parser
from dashboard.cli.lake_flags import add_config_flag
from sinks.locations import is_s3_url


def add_tool_parsers(commands: Parsers) -> None:
    _add_deferred(commands, "query", "query the Parquet store (summary, tasks, steps, ...)")
    _add_deferred(commands, "dashboard", "serve the web dashboard over a Parquet store")
    _add_compact(commands)
    add_dlq_parser(commands)
    _add_export_traces(commands)


def _add_deferred(commands: Parsers, name: str, summary: str) -> None:
    """Register `name` without importing DuckDB's query layer: `evagg run` stays lean
    (DuckDB alone adds about 60 MB to a process). Its real parser is built when it runs."""
    stub = commands.add_parser(name, help=summary, add_help=False)
    stub.add_argument("rest", nargs=argparse.REMAINDER)
    stub.set_defaults(command=lambda args: run_deferred(name, args.rest))


def run_deferred(name: str, rest: list[str]) -> int:
    parser = EvaggParser(prog="evagg")
    commands = subcommands(parser)
    if name == "query":  # each imports only its own layer: a query never loads aiohttp
        from aggregator.cli.query_ddl import add_ddl_parser
        from dashboard.cli.query import add_query_parser, default_data

        add_ddl_parser(add_query_parser(commands), default_data)
    else:
        from dashboard.web.server import add_dashboard_parser

        add_dashboard_parser(commands)
    args = parse_naming_the_command(parser, [name, *rest])
    if not _lake_from_config(f"evagg {name}", args):
        return 2
    code: int = args.command(args)
    return code


def _lake_from_config(command: str, args: argparse.Namespace,
                      options: tuple[str, ...] = ()) -> bool:
    """args.data from the agent's config where no --data names a lake (with the sink's
    `options` where their flags are unset); False (having said why) when the config names
    no one lake."""
    from aggregator.cli.lake_choice import LakeChoiceError, apply_config_lake
    from aggregator.config import ConfigError

    try:
        apply_config_lake(args, options)
    except (LakeChoiceError, ConfigError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return False
    return True


def _add_compact(commands: Parsers) -> None:
    compact = commands.add_parser(
        "compact", help="merge a partition's small Parquet files",
        description="Merge each date=/hour=/node= partition's Parquet files into one file "
                    "(one row per event_id) and write its task fragment under _tasks/, as "
                    "the agent's hour merge does; build the fragment of a merged file that "
                    "lacks one.")
    compact.add_argument("target", nargs="?",
                         help="local directory or s3://bucket/prefix/ (default: --data, else "
                              "the lake of --config, else $EVAGG_DATA, else the user's data "
                              "directory, as `evagg query`)")
    compact.add_argument("--data", help="the lake, as the positional target")
    add_config_flag(compact)
    compact.add_argument("--partition", help="only this partition, e.g. date=2026-11-29/hour=13")
    compact.add_argument("--min-files", type=_at_least_two, default=2,
                         help="merge a partition only when it has at least this many files "
                              "older than --grace (default 2; a partition of one file is "
                              "left as it is)")
    compact.add_argument("--endpoint-url", help="S3-compatible endpoint")
    compact.add_argument("--grace", type=float, default=600.0,
                         help="leave files younger than this many seconds alone (default "
                              "%(default)g: the agent may still be merging their hour)")
    compact.add_argument("--sse", help="S3 server-side encryption of merged files: AES256, "
                         "aws:kms or aws:kms:dsse (as the sink's `sse`)")
    compact.add_argument("--sse-kms-key-id", help="the KMS key for --sse aws:kms")
    compact.add_argument("--storage-class", help="S3 storage class of merged files, e.g. "
                         "STANDARD_IA (as the sink's `storage_class`)")
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
    compact.set_defaults(command=_compact)


def _at_least_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 2:
        raise argparse.ArgumentTypeError("at least 2: merging one file changes nothing")
    return value


def _compact(args: argparse.Namespace) -> int:
    from dashboard.cli.query import default_data
    from sinks.parquet.compact import run_compact
    from sinks.parquet.options import UPLOAD_KEYS
    from sinks.parquet.s3_uploads import upload_args
    from sinks.parquet.stores import StoreError

    if args.target and args.data and args.target != args.data:
        print("evagg compact: give the lake once, as the target or as --data",
              file=sys.stderr)
        return 2
    args.data = args.target or args.data
    # merged files are uploaded as the agent's hour merge uploads them
    if not _lake_from_config("evagg compact", args, UPLOAD_KEYS):
        return 2
    args.target = args.data or default_data()
    try:
        uploads = upload_args(args.sse, args.sse_kms_key_id, args.storage_class)
    except ValueError as exc:  # name the flag, not the sink's option
        option, _, reason = str(exc).partition(": ")
        print(f"evagg compact: --{option.replace('_', '-')}: {reason}", file=sys.stderr)
        return 2
    if uploads and not is_s3_url(args.target):
        print("evagg compact: --sse, --sse-kms-key-id and --storage-class apply to s3:// "
              "targets only", file=sys.stderr)
        return 2
    try:
        report = run_compact(args.target, partition=args.partition, min_files=args.min_files,
                             endpoint_url=args.endpoint_url, dry_run=args.dry_run,
                             grace_s=args.grace, upload_args=uploads,
                             rewrite_types=args.rewrite_types)
    except (ValueError, OSError, StoreError) as exc:
        print(f"evagg compact: {exc}", file=sys.stderr)
        return 1
    print(report)
    return 1 if report.errors else 0


def _add_export_traces(commands: Parsers) -> None:
    export = commands.add_parser("export-traces",
                                 help="write spans from Parquet as OTLP JSON for Jaeger")
    export.add_argument("--data", help="local directory or s3://bucket/prefix/ (default: "
                                       "the lake of --config, else $EVAGG_DATA, else the "
                                       "user's data directory, as `evagg query`)")
    add_config_flag(export)
    export.add_argument("--trace-id", type=_trace_id, help="32 hex digits")
    export.add_argument("--since", type=_since,
                        help="ISO time (2026-11-29T12:00, UTC unless it says) or an age "
                             "such as 30m, 2h, 3d")
    export.add_argument("--out", type=Path, default=Path("traces.json"),
                        help="the OTLP JSON file to write (default traces.json)")
    export.set_defaults(command=_export_traces)


def _trace_id(text: str) -> str:
    from aggregator.cli.export_traces import checked_trace_id

    try:
        return checked_trace_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _since(text: str) -> datetime:
    from dashboard.lake.errors import BadInput
    from dashboard.questions.filters import parse_time

    try:
        return parse_time(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _export_traces(args: argparse.Namespace) -> int:
    from aggregator.cli.export_traces import export_traces
    from dashboard.cli.query import default_data

    if not args.trace_id and not args.since:
        print("evagg export-traces: give --trace-id or --since (e.g. --since 30m)",
              file=sys.stderr)
        return 2
    if not _lake_from_config("evagg export-traces", args):
        return 2
    data = args.data or default_data()
    try:
        spans = export_traces(data, trace_id=args.trace_id, since=args.since, out=args.out)
    except (ValueError, OSError) as exc:  # NothingToExport too: no file, exit 1
        print(f"evagg export-traces: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {spans} spans to {args.out}")
    return 0
