"""Offline tools: `evagg query`, `dashboard`, `compact`, `dlq`, `export-traces`.

Each imports its implementation only when run, so `evagg run` starts without DuckDB's
query layer, boto3 or the OpenTelemetry protobufs loaded.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.cli.arguments import (
    EvaggParser,
    Parsers,
    parse_naming_the_command,
    subcommands,
)
from dashboard.cli.lake_flags import add_config_flag
from sinks.locations import is_s3_url

if TYPE_CHECKING:
    from aggregator.config import AgentConfig
    from aggregator.config.sinks import SinkConfig
    from sinks.http.deadletter import DeadLetter


def add_tool_parsers(commands: Parsers) -> None:
    _add_deferred(commands, "query", "query the Parquet store (summary, tasks, steps, ...)")
    _add_deferred(commands, "dashboard", "serve the web dashboard over a Parquet store")
    _add_compact(commands)
    _add_dlq(commands)
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


def _add_dlq(commands: Parsers) -> None:
    dlq = commands.add_parser("dlq", help="list or replay an HTTP sink's dead letters")
    dlq.add_argument("action", choices=["list", "replay"])
    dlq.add_argument("--sink", required=True, help="the HTTP sink's name in the config")
    dlq.add_argument("--config", type=Path, help="TOML file (default: $EVAGG_CONFIG or none)")
    dlq.add_argument("--url", help="replay to this URL instead of the sink's configured one")
    dlq.set_defaults(command=_dlq)


def _no_such_sink(name: str, config: AgentConfig, action: str) -> str:
    """Why `--sink NAME` names nothing, and what to pass instead."""
    http = [s.name for s in config.sinks if s.type == "http"]
    if config.source_path is None:
        return (f"no http sink named {name!r}: no config was given (--config or "
                "$EVAGG_CONFIG), and the embedded default has no http sink; pass the config "
                f"the agent runs with: evagg dlq {action} --sink {name} --config FILE")
    named = f"its http sinks: {', '.join(http)}" if http else "it has no http sink"
    return f"no http sink named {name!r} in {config.source_path} ({named})"


def _dlq(args: argparse.Namespace) -> int:
    import asyncio

    from aggregator.config import ConfigError, load_config
    from aggregator.config.sinks import sink_name_problem
    from aggregator.delivery.build import sink_problem
    from sinks.http.deadletter import dead_letter_dir, list_dead_letters
    from sinks.http.endpoint import url_for_display
    from sinks.http.replay import replay_dead_letters

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"evagg dlq: config error: {exc}", file=sys.stderr)
        return 2
    named = sink_name_problem(args.sink)
    if named:
        print(f"evagg dlq: --sink {named}", file=sys.stderr)
        return 2
    sink = next((s for s in config.sinks if s.name == args.sink and s.type == "http"), None)
    directory = dead_letter_dir(config.state_dir, args.sink)
    # `evagg status` and the agent's log name `evagg dlq list --sink NAME` without the
    # agent's config: with no config the letters are still found in the default state_dir
    # (the agent's too, unless its config moves it), and anything else says what to pass.
    listed_without_sink = (sink is None and config.source_path is None
                           and args.action == "list" and directory.is_dir())
    if sink is None and not listed_without_sink:
        print(f"evagg dlq: {_no_such_sink(args.sink, config, args.action)}", file=sys.stderr)
        return 2
    if args.action == "list":  # needs none of the sending options (keys, proxy, headers)
        letters = list_dead_letters(directory)
        for letter in letters:
            print(dead_letter_line(letter))
        events = sum(letter.events for letter in letters)
        print(f"{len(letters)} dead-lettered batches ({events} events) in {directory}")
        if letters:
            config_flag = " --config <the agent's config>" if sink is None else ""
            print(f"`evagg dlq replay --sink {args.sink}{config_flag}` sends them again "
                  "(--url to send them elsewhere)")
        return 0
    assert sink is not None
    url = args.url or sink.url
    try:
        sending = _replay_options(sink, url)
    except ValueError as exc:  # refused as `evagg check-config` and `evagg run` refuse it
        index = config.sinks.index(sink)
        print(f"evagg dlq: config error: {sink_problem(index, sink, exc)}", file=sys.stderr)
        return 2
    report = asyncio.run(replay_dead_letters(directory, url, **sending))
    print(f"sent {report.sent} batches ({report.events_sent} events) to "
          f"{url_for_display(url)}; their files are deleted")
    if report.split:
        print(f"{report.split} requests refused as too large (HTTP 413) were sent again in "
              "halves")
    if report.failed:
        print(f"{report.failed} batches failed and stay in {directory}:")
        for error in report.errors:
            print(f"  {error}")
    return 0 if not report.failed else 1


def dead_letter_line(letter: DeadLetter) -> str:
    """One dead letter as an operator reads it: when, the answer, how many, the key."""
    response = " ".join(letter.response.split())
    response = response if len(response) <= 60 else response[:59] + "…"
    return (f"{letter.time}  HTTP {letter.status}  {letter.events} events  key {letter.key}  "
            f"{letter.url}  {response!r}")


def _replay_options(sink: SinkConfig, url: str) -> dict[str, Any]:
    """What a replay sends with: the sink's own options, read as the agent reads them."""
    from sinks.http.options import HttpOptions, check_url
    from sinks.http.proxy import proxy_route
    from sinks.http.tls import client_ssl

    options = HttpOptions.from_table(sink.options)
    check_url(url, options)
    return {"headers": dict(options.headers), "gzip": options.gzip,
            "timeout_s": options.timeout_s, "ssl": client_ssl(options.tls),
            "proxy": proxy_route(url, options.proxy)}


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
