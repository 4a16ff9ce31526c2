"""Offline tools: `evagg query`, `dashboard`, `export-traces`, and the parsers of
`compact` and `dlq` (their front doors are aggregator/cli/compact.py and dlq.py).

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
from aggregator.cli.compact import add_compact_parser
from aggregator.cli.dlq import add_dlq_parser
from dashboard.cli.lake_flags import add_config_flag


def add_tool_parsers(commands: Parsers) -> None:
    _add_deferred(commands, "query", "query the Parquet store (summary, tasks, steps, ...)")
    _add_deferred(commands, "dashboard", "serve the web dashboard over a Parquet store")
    add_compact_parser(commands)
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


def _lake_from_config(command: str, args: argparse.Namespace) -> bool:
    """args.data from the agent's config where no --data names a lake; False (having
    said why) when the config names no one lake."""
    from aggregator.cli.lake_choice import LakeChoiceError, apply_config_lake
    from aggregator.config import ConfigError

    if getattr(args, "lake", None) and not getattr(args, "data", None):
        args.data = args.lake  # `query ddl` names its lake as an argument: its --data
    try:
        apply_config_lake(args)
    except (LakeChoiceError, ConfigError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return False
    return True


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
